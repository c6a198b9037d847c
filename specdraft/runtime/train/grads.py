"""The gradients across ranks: each summed over the ranks that hold the same parameter and saw other tokens (dense:
dp x cp; experts: expert dp; sequence-parallel norms and router, and QK norms: also tp; a tied embedding: first and
last stage), and the global grad norm that counts every shard exactly once. Summed, never averaged: the losses are
normalised over the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from specdraft.runtime.models import moe


@dataclass(frozen=True)
class TargetParams:
    """The target's parameters on this rank, split the way their grads are reduced."""

    dense: tuple  # replicated over dp x cp; TP-sharded or TP-replicated
    experts: tuple  # routed experts: sharded over ep and etp, replicated over the expert data-parallel group
    has_experts: bool  # an MoE model (a stage without layers still joins the expert norm's all-reduce)
    qk_norms: tuple = ()  # of dense: the per-head query/key norms, TP-replicated but fed by this rank's heads only

    @classmethod
    def of(cls, chunks) -> "TargetParams":
        dense, experts, qk_norms = [], [], []
        for chunk in chunks:
            for name, param in chunk.named_parameters():
                (experts if moe.is_expert(name) else dense).append(param)
                if "q_layernorm" in name or "k_layernorm" in name:  # megatron's finalize_model_grads test
                    qk_norms.append(param)
        has_experts = any(getattr(c.config, "num_moe_experts", None) for c in chunks)
        return cls(tuple(dense), tuple(experts), has_experts, tuple(qk_norms))

    def all(self) -> list:
        return [*self.dense, *self.experts]


def reduce_target_grads(params: TargetParams, sequence_parallel: bool) -> None:
    """Sum each grad over the ranks that hold the same parameter and saw other tokens: dense ones over dp x cp,
    experts over megatron's expert data-parallel group (the ranks holding the same expert shard), and also over
    tp: parameters tagged `sequence_parallel` (norms, the MoE router), since each TP rank saw 1/tp of the tokens,
    and the QK norms, since each TP rank normalised 1/tp of the heads (each parameter once, as megatron does)."""
    from megatron.core import parallel_state as ps

    dense = [p for p in params.dense if p.grad is not None]
    experts = [p for p in params.experts if p.grad is not None]
    all_reduce_grads(dense, ps.get_data_parallel_group(with_context_parallel=True))
    all_reduce_grads(experts, ps.get_expert_data_parallel_group())
    qk = {id(p) for p in params.qk_norms}
    over_tp = [p for p in dense if id(p) in qk or (sequence_parallel and getattr(p, "sequence_parallel", False))]
    all_reduce_grads(over_tp, ps.get_tensor_model_parallel_group())


def reduce_tied_embedding_grads(params: TargetParams) -> None:
    """Tied embeddings over pp > 1: the first stage's word embedding and the last stage's output layer are two copies
    of one weight (megatron tags both `shared_embedding`), so their grads are summed over megatron's embedding group
    (the first and last stage of each tp/dp/cp position), as finalize_model_grads does. pp = 1 shares one tensor."""
    from megatron.core import parallel_state as ps

    tied = [p for p in params.dense if getattr(p, "shared_embedding", False) and p.grad is not None]
    if tied and ps.is_rank_in_embedding_group(ignore_virtual=True):
        all_reduce_grads(tied, ps.get_embedding_group())


def target_grad_norm(params: TargetParams, device) -> float:
    """Global L2 norm of the target's (reduced) grads, as megatron's get_grad_norm_fp32 counts it.

    Dense: TP-sharded grads summed over the model-parallel group (tp x pp), TP-replicated ones counted on tp rank
    0 only, the last stage's copy of a tied embedding (`shared`) not at all. Experts: every local expert grad is a
    distinct shard within the expert tensor-model-pipeline group (etp x ep x pp), so all of them are summed over
    that group. One host sync: the squares are summed on the device.
    """
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    dense = _sum_of_squares(
        [
            p.grad
            for p in params.dense
            if p.grad is not None
            and not getattr(p, "shared", False)
            and (getattr(p, "tensor_model_parallel", False) or tp_rank == 0)
        ],
        device,
    )
    experts = _sum_of_squares([p.grad for p in params.experts if p.grad is not None], device)
    parts = torch.stack([dense, experts])  # NCCL reduces device tensors
    dense_part, expert_part = parts[:1], parts[1:]
    dist.all_reduce(dense_part, group=ps.get_model_parallel_group())
    if params.has_experts:
        dist.all_reduce(expert_part, group=ps.get_expert_tensor_model_pipeline_parallel_group())
    return float(parts.sum().sqrt())


def replicated_grad_norm(params, group, device) -> float:
    """Global L2 norm of a model replicated over dp x cp and tensor-parallel over ``group`` (the draft): TP-sharded
    grads summed over the group, TP-replicated ones counted once (tp rank 0)."""
    tp_rank = dist.get_rank(group) if group is not None else 0
    total = _sum_of_squares(
        [p.grad for p in params if p.grad is not None and (getattr(p, "tensor_model_parallel", False) or tp_rank == 0)],
        device,
    )[None]
    if group is not None:
        dist.all_reduce(total, group=group)
    return float(total.sqrt())


def _sum_of_squares(grads, device, chunk: int = 1 << 24) -> torch.Tensor:
    """Sum of squared elements in float64 on the device (a float64 scalar tensor), ``chunk`` elements at a time so a
    large grad is never copied whole to float64."""
    parts = [piece.double().square().sum() for g in grads for piece in g.reshape(-1).split(chunk)]
    return torch.stack(parts).sum() if parts else torch.zeros((), dtype=torch.float64, device=device)


def all_reduce_grads(params, group) -> None:
    """Sum the grads of ``params`` over ``group`` in one flat all-reduce (every member passes the same list)."""
    if params and dist.get_world_size(group) > 1:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def clip_grads(params, norm: float, max_norm: float) -> None:
    if norm > max_norm:
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, max_norm / (norm + 1e-6))
