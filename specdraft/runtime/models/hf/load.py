"""A rank's policy chunks initialised from a HF checkpoint: each parameter shard is read from the HF slices that
mapping.source names for it (global layer, global expert, this rank's tp or etp slice), nothing else."""

from __future__ import annotations

import torch

from specdraft.runtime.models import moe
from specdraft.runtime.models.hf import mapping
from specdraft.runtime.models.hf.checkpoint import CheckpointError, HFCheckpoint, geometry
from specdraft.runtime.models.hf.reader import Reader


@torch.no_grad()
def load_chunk(model: torch.nn.Module, checkpoint: HFCheckpoint, plan, offset: int, reader: Reader) -> set[str]:
    """Fill every parameter of one GPTModel chunk (its first layer is global layer ``offset``); returns the HF
    tensors it read from."""
    from megatron.core import parallel_state as ps

    g = geometry(plan.model, checkpoint.family)
    tp_size = plan.parallel.tp
    tp = mapping.Shard(tp_size, ps.get_tensor_model_parallel_rank() if tp_size > 1 else 0)
    local_experts = moe.num_local_experts(model)
    tied = plan.model.tie_embeddings
    read: set[str] = set()
    for name, param in model.named_parameters():
        gname = mapping.global_name(name, offset)
        etp = mapping.Shard()
        if moe.is_expert(gname):
            gname, size, rank = moe.expert_parameter(gname, local_experts)
            etp = mapping.Shard(size, rank)
        try:
            source = mapping.source(gname, g, tp, etp, tied_output=tied and gname == "output_layer.weight")
        except mapping.UnmappedParameter:
            raise CheckpointError(
                f"the plan's model has parameter {gname!r}, which no tensor of a {checkpoint.family.name} "
                f"checkpoint ({checkpoint.folder}) maps to",
                "build the model the checkpoint describes (its config.json), or train from random weights",
            ) from None
        reader.fill(param.data, source, gname)
        read.update(p.name for p in source.pieces)
    return read


def load_chunks(chunks: list, plan, pp_rank: int, checkpoint: HFCheckpoint) -> int:
    """Fill this pipeline rank's chunks; returns the bytes read. Every dense tensor of this rank's layers must have
    been read: one the built model has no parameter for (say q_norm of a model built without QK norm) would
    otherwise be dropped without a word."""
    with Reader(checkpoint) as reader:
        read: set[str] = set()
        for chunk, model in zip(plan.stages[pp_rank].chunks, chunks):
            read |= load_chunk(model, checkpoint, plan, chunk.first_layer, reader)
        layers = {layer for c in plan.stages[pp_rank].chunks for layer in range(c.first_layer, c.last_layer + 1)}
        wanted = mapping.hf_tensors(geometry(plan.model, checkpoint.family))
        unread = sorted(n for n in wanted if _layer(n) in layers and ".experts." not in n and n not in read)
        if unread:
            raise CheckpointError(
                f"{checkpoint.folder}: the model the runtime built has no parameter for {unread[0]!r} (and "
                f"{len(unread) - 1} more tensors of its layers)",
                "the plan's model section says more than this runtime builds (e.g. model.qk_layernorm): report it",
            )
        return reader.bytes_read


def _layer(hf_name: str) -> int | None:
    parts = hf_name.split(".")
    return int(parts[2]) if len(parts) > 3 and parts[:2] == ["model", "layers"] else None
