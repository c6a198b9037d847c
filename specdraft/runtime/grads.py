"""The target's gradients across ranks: each summed over the ranks that hold the same parameter and saw other
tokens (dense: dp x cp; experts: expert dp; sequence-parallel norms and router: also tp), and the global grad norm
that counts every shard exactly once. Summed, never averaged: the losses are normalised over the global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from specdraft.runtime import moe


@dataclass(frozen=True)
class TargetParams:
    """The target's parameters on this rank, split the way their grads are reduced."""

    dense: tuple  # replicated over dp x cp; TP-sharded or TP-replicated
    experts: tuple  # routed experts: sharded over ep and etp, replicated over the expert data-parallel group
    has_experts: bool  # an MoE model (a stage without layers still joins the expert norm's all-reduce)

    @classmethod
    def of(cls, chunks) -> "TargetParams":
        dense, experts = [], []
        for chunk in chunks:
            for name, param in chunk.named_parameters():
                (experts if moe.is_expert(name) else dense).append(param)
        has_experts = any(getattr(c.config, "num_moe_experts", None) for c in chunks)
        return cls(tuple(dense), tuple(experts), has_experts)

    def all(self) -> list:
        return [*self.dense, *self.experts]


def reduce_target_grads(params: TargetParams, sequence_parallel: bool) -> None:
    """Sum each grad over the ranks that hold the same parameter and saw other tokens: dense ones over dp x cp,
    experts over megatron's expert data-parallel group (the ranks holding the same expert shard), and parameters
    tagged `sequence_parallel` (norms, the MoE router) also over tp, since each TP rank saw 1/tp of the tokens."""
    from megatron.core import parallel_state as ps

    dense = [p for p in params.dense if p.grad is not None]
    experts = [p for p in params.experts if p.grad is not None]
    all_reduce_grads(dense, ps.get_data_parallel_group(with_context_parallel=True))
    all_reduce_grads(experts, ps.get_expert_data_parallel_group())
    if sequence_parallel:
        all_reduce_grads([p for p in dense if getattr(p, "sequence_parallel", False)],
                         ps.get_tensor_model_parallel_group())


def target_grad_norm(params: TargetParams, device) -> float:
    """Global L2 norm of the target's (reduced) grads, as megatron's get_grad_norm_fp32 counts it.

    Dense: TP-sharded grads summed over the model-parallel group (tp x pp), TP-replicated ones counted on tp rank
    0 only. Experts: every local expert grad is a distinct shard within the expert tensor-model-pipeline group
    (etp x ep x pp), so all of them are summed over that group.
    """
    from megatron.core import parallel_state as ps

    tp_rank = ps.get_tensor_model_parallel_rank()
    dense = sum(float(p.grad.double().pow(2).sum()) for p in params.dense if p.grad is not None
                and (getattr(p, "tensor_model_parallel", False) or tp_rank == 0))
    experts = sum(float(p.grad.double().pow(2).sum()) for p in params.experts if p.grad is not None)
    parts = torch.tensor([dense, experts], dtype=torch.float64, device=device)  # NCCL reduces device tensors
    dense_part, expert_part = parts[:1], parts[1:]
    dist.all_reduce(dense_part, group=ps.get_model_parallel_group())
    if params.has_experts:
        dist.all_reduce(expert_part, group=ps.get_expert_tensor_model_pipeline_parallel_group())
    return float(parts.sum().sqrt())


def all_reduce_grads(params, group) -> None:
    """Sum the grads of ``params`` over ``group`` in one flat all-reduce (every member passes the same list)."""
    if params and dist.get_world_size(group) > 1:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


def clip_grads(params, norm: float, max_norm: float) -> None:
    if norm > max_norm:
        for p in params:
            p.grad.mul_(max_norm / (norm + 1e-6))
