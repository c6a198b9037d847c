"""A rank's policy chunks initialised from a HF checkpoint: each parameter shard is read from the HF slices that
mapping.source names for it (global layer, global expert, this rank's tp or etp slice), nothing else."""

from __future__ import annotations

import torch

from specdraft.runtime.models import moe
from specdraft.runtime.models.hf import mapping
from specdraft.runtime.models.hf.checkpoint import CheckpointError, HFCheckpoint, geometry
from specdraft.runtime.models.hf.reader import Reader


@torch.no_grad()
def load_chunk(model: torch.nn.Module, checkpoint: HFCheckpoint, plan, offset: int, reader: Reader) -> None:
    """Fill every parameter of one GPTModel chunk (its first layer is global layer ``offset``)."""
    from megatron.core import parallel_state as ps

    g = geometry(plan.model, checkpoint.family)
    tp_size = plan.parallel.tp
    tp = mapping.Shard(tp_size, ps.get_tensor_model_parallel_rank() if tp_size > 1 else 0)
    local_experts = moe.num_local_experts(model)
    tied = plan.model.tie_embeddings
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


def load_chunks(chunks: list, plan, pp_rank: int, checkpoint: HFCheckpoint) -> int:
    """Fill this pipeline rank's chunks; returns the bytes read."""
    with Reader(checkpoint) as reader:
        for chunk, model in zip(plan.stages[pp_rank].chunks, chunks):
            load_chunk(model, checkpoint, plan, chunk.first_layer, reader)
        return reader.bytes_read
