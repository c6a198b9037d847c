"""MoE targets in the runtime: megatron-core's MoE settings for `model.num_experts`, the global name and shard of
each expert parameter (so weights are initialised independently of ep/etp), and the router's load-balancing loss
as megatron tracks it (reported per step in metrics.jsonl)."""

from __future__ import annotations

import re

import torch

from specdraft.plan.model import LaunchPlan

# SequentialMLP's parameters: `...mlp.experts.local_experts.<local index>.linear_fc1.weight`.
_LOCAL_EXPERT = re.compile(r"(\.mlp\.experts\.local_experts\.)(\d+)(\.)")
DISPATCHER = "alltoall"  # megatron's all-to-all token dispatcher: gloo and NCCL both have all_to_all_single


def config_kwargs(plan: LaunchPlan) -> dict:
    """TransformerConfig fields of an MoE target ({} for a dense one)."""
    m, par = plan.model, plan.parallel
    if not m.num_experts:
        return {}
    return dict(
        num_moe_experts=m.num_experts,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size,
        moe_router_topk=m.moe_router_topk,
        # megatron-core refuses top-1 softmax routing without it: softmax over one score has a zero gradient.
        moe_router_pre_softmax=m.moe_router_topk == 1,
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.etp,
        moe_token_dispatcher_type=DISPATCHER,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=aux_loss_coeff(plan),
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_router_fusion=False,
    )


def without_transformer_engine() -> None:
    """megatron-core 0.16.1's router gating names `te_general_gemm` (transformer/moe/moe_utils.py:1192,1225) but
    binds it only when TransformerEngine imports (moe_utils.py:22-39): without TE the router raises NameError.
    None is the value its own checks expect for "no TE", so the plain torch.mm path runs. Idempotent."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def aux_loss_coeff(plan: LaunchPlan) -> float:
    """The coefficient megatron-core is given, so that the load-balancing gradient equals Megatron-LM's.

    megatron scales each microbatch's aux-loss gradient by cp / num_microbatches (schedules.py:292) because
    Megatron-LM's DDP then *averages* grads over dp x cp: per global microbatch the gradient is
    coeff / (num_microbatches * dp) (router.py:455 says so). specdraft's runtime *sums* grads over dp x cp (its
    losses are normalised over the global batch), so megatron gets coeff / (cp * dp) for the same gradient.
    """
    par = plan.parallel
    return plan.model.moe_aux_loss_coeff / (par.cp * par.dp)


def is_expert(name: str) -> bool:
    """True for a routed expert's parameter (sharded over ep and etp, replicated over the expert dp group)."""
    return _LOCAL_EXPERT.search(name) is not None


def expert_parameter(name: str, num_local_experts: int) -> tuple[str, int, int]:
    """(global name, etp size, etp rank) of this rank's expert parameter ``name`` (layers already global).

    Expert e of a layer lives on the ep rank e // num_local_experts as local expert e % num_local_experts
    (megatron's BaseMoELayer.local_expert_indices), and each expert's linears are split over etp like a dense MLP
    over tp.
    """
    from megatron.core import parallel_state as ps

    ep_rank = ps.get_expert_model_parallel_rank()
    etp = ps.get_expert_tensor_parallel_world_size()
    etp_rank = ps.get_expert_tensor_parallel_rank() if etp > 1 else 0

    def to_global(match: re.Match) -> str:
        return f"{match.group(1)}{ep_rank * num_local_experts + int(match.group(2))}{match.group(3)}"

    return _LOCAL_EXPERT.sub(to_global, name, count=1), etp, etp_rank


def num_local_experts(model: torch.nn.Module) -> int:
    from megatron.core import parallel_state as ps

    experts = getattr(model.config, "num_moe_experts", None) or 0
    return experts // ps.get_expert_model_parallel_world_size() if experts else 0


def take_aux_loss() -> float:
    """This rank's share of the load-balancing loss since the last call, summed over layers and microbatches.

    The router records `aux_loss / coeff` per layer (router.py:446), computed on this rank's tokens; summed over
    every rank that is the loss over all tokens of the step (tp/cp ranks hold disjoint tokens of one microbatch,
    dp ranks other microbatches, pp ranks other layers). Clears megatron's tracker.
    """
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

    entry = get_moe_layer_wise_logging_tracker().get("load_balancing_loss")
    total = float(entry["values"].double().sum()) if entry else 0.0
    clear_aux_losses_tracker()
    return total
