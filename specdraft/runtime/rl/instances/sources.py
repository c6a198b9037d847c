"""What one trainer rank sends to the rollout instances: instance i is fed by data-parallel replica i % dp (its
context rank 0) and, for experts, by expert-data-parallel rank i % edp, so the sends spread over the replicas. A
rank sends the HF slices of the shards it holds (hf/mapping.source: the inverse of hf/load.py), and the draft's
stage sends the draft whole, in EAGLE-3 names (serve/eagle3.tensors), from its tensor rank 0."""

from __future__ import annotations

import torch

from specdraft.runtime.models import moe
from specdraft.runtime.models.hf import export as hf_export
from specdraft.runtime.models.hf import mapping
from specdraft.runtime.models.hf.checkpoint import FAMILIES, geometry
from specdraft.runtime.rl.instances.buckets import Slice


def feeds_dense(trainer, instance: int) -> bool:
    """This rank's dense shards go to ``instance``: its replica is instance % dp, and it is context rank 0."""
    return trainer.ctx.coords.dp == instance % trainer.plan.parallel.dp and trainer.cp_rank == 0


def feeds_experts(trainer, instance: int) -> bool:
    """This rank's expert shards go to ``instance``: its expert-data-parallel rank is instance % edp."""
    if not trainer.plan.model.num_experts:
        return False
    ps = trainer.ps
    return ps.get_expert_data_parallel_rank() == instance % ps.get_expert_data_parallel_world_size()


def policy_geometry(plan):
    return geometry(plan.model, FAMILIES[hf_export.policy_architecture(plan)])


def policy_shapes(plan) -> dict[str, tuple[int, ...]]:
    """Every HF tensor of the policy with its shape: what an engine assembles."""
    return mapping.hf_tensors(policy_geometry(plan))


def policy_slices(trainer, *, dense: bool, experts: bool) -> list[Slice]:
    """The HF slices of this rank's dense shards (``dense``) and expert shards (``experts``), in the export dtype."""
    ps, plan = trainer.ps, trainer.plan
    g = policy_geometry(plan)
    dtype = hf_export.export_dtype(plan)
    tp = mapping.Shard(trainer.tp, ps.get_tensor_model_parallel_rank() if trainer.tp > 1 else 0)
    shapes = mapping.hf_tensors(g)
    out = []
    for chunk, model in zip(plan.stages[trainer.pp_rank].chunks, trainer.chunks):
        local_experts = moe.num_local_experts(model)
        for name, param in model.named_parameters():
            gname, etp = mapping.global_name(name, chunk.first_layer), mapping.Shard()
            if moe.is_expert(gname):
                if not experts:
                    continue
                gname, size, rank = moe.expert_parameter(gname, local_experts)
                etp = mapping.Shard(size, rank)
            elif not dense:
                continue
            if gname == "output_layer.weight" and plan.model.tie_embeddings:
                continue  # a copy of the embedding, which the first stage sends
            at = 0
            for piece in mapping.source(gname, g, tp, etp).pieces:
                shape = shapes[piece.name]
                rows = piece.rows or (0, shape[0])
                out.append(Slice(piece.name, shape, dtype, rows, piece.cols, param, at))
                at += rows[1] - rows[0]
    return out


def feeds_draft(trainer, instance: int) -> bool:
    """This rank takes part in gathering the draft ``instance`` gets: the draft's stage of the feeding replica."""
    return trainer.draft is not None and feeds_dense(trainer, instance)


def draft_state(trainer) -> dict[str, torch.Tensor]:
    """The whole draft in its runtime names on tensor rank 0 of the draft's stage ({} on its other tensor ranks):
    collective over the draft's tensor-parallel group (serve/export.whole_draft_state gathers its TP shards)."""
    from specdraft.runtime.serve.export import whole_draft_state

    state = {
        k: v.detach()
        for k, v in whole_draft_state(trainer).items()
        if isinstance(v, torch.Tensor) and not k.endswith("._extra_state")  # TE's fp8 metadata: no weight
    }
    return state if trainer.ps.get_tensor_model_parallel_rank() == 0 else {}


def draft_tensors(trainer, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The draft's EAGLE-3 tensors (the names vLLM's drafter and the built-in engine load)."""
    from specdraft.runtime.serve import eagle3

    return eagle3.tensors(state, trainer.plan)


def whole_slices(tensors: dict[str, torch.Tensor]) -> list[Slice]:
    """Each tensor whole, in its own dtype."""
    return [Slice(name, tuple(t.shape), t.dtype, (0, t.shape[0]), None, t, 0) for name, t in tensors.items()]
