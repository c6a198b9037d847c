"""The layer-to-stage map: which (pp rank, virtual chunk) builds each transformer layer, exactly as Megatron does.

Mirrors megatron-core 0.16 `get_transformer_layer_offset` / `get_num_layers_to_build` for even, uneven
(first/last stage) and interleaved (vpp) splits; tests check it against megatron-core itself.
"""

from __future__ import annotations

from specdraft.plan.model import ChunkPlan, StagePlan
from specdraft.spec.accounting import PipelineSplit, layer_counts, split_accounting
from specdraft.spec.derived import vpp as resolved_vpp


def chunk_layout(num_layers: int, p: PipelineSplit) -> list[list[tuple[int, int]]]:
    """Per pp rank, per virtual chunk: (first_layer, num_layers) of the split ``p`` (the plan's ParallelDims, or a
    spec's parallel section being validated). One chunk per rank without vpp."""
    n = num_layers
    counts = layer_counts(n, p)
    if counts is None:
        raise ValueError("invalid pipeline split; run validation first")
    vpp = resolved_vpp(p) or 1
    if split_accounting(p) != (0, 0):
        return _accounted_chunks(n, p, vpp)
    first, last = p.first_stage_layers, p.last_stage_layers
    uneven = first is not None or last is not None
    out: list[list[tuple[int, int]]] = []
    for rank in range(p.pp):
        per_chunk = counts[rank] // vpp
        chunks = []
        for v in range(vpp):
            if vpp == 1:
                offset = sum(counts[:rank])
            elif not uneven:
                offset = v * (n // vpp) + rank * (n // (p.pp * vpp))
            else:
                middle_stages = p.pp - (first is not None) - (last is not None)
                middle_layers = n - (first or 0) - (last or 0)
                first_chunk = (first or 0) // vpp
                middle_chunk = middle_layers // vpp
                round_layers = first_chunk + middle_chunk + (last or 0) // vpp
                middle_rank = rank if first is None else rank - 1
                if rank == 0:
                    offset = v * round_layers
                else:
                    offset = (
                        v * round_layers
                        + first_chunk
                        + middle_rank * (middle_chunk // middle_stages if middle_stages else 0)
                    )
            chunks.append((offset, per_chunk))
        out.append(chunks)
    return out


def _accounted_chunks(num_layers: int, p: PipelineSplit, vpp: int) -> list[list[tuple[int, int]]]:
    """The split with the embedding and/or loss counted as layers: every chunk holds (N + e + l) / (pp * vpp)
    slots; the embedding takes the first slot of (stage 0, chunk 0), the loss the last of the last chunk."""
    e, loss = split_accounting(p)
    total = num_layers + e + loss
    per_chunk = total // p.pp // vpp
    out = []
    for rank in range(p.pp):
        chunks = []
        for v in range(vpp):
            slot = v * (total // vpp) + rank * per_chunk  # first slot of this chunk, embedding slot included
            first_chunk, last_chunk = rank == 0 and v == 0, rank == p.pp - 1 and v == vpp - 1
            offset = slot - (e if not first_chunk else 0)
            count = per_chunk - (e if first_chunk else 0) - (loss if last_chunk else 0)
            chunks.append((offset, count))
        out.append(chunks)
    return out


def stage_records(num_layers: int, dims: PipelineSplit) -> tuple[StagePlan, ...]:
    """The plan's `stages`: first/last layer (0-indexed, inclusive) per pp rank, and its chunks in schedule order."""
    records = []
    for rank, chunks in enumerate(chunk_layout(num_layers, dims)):
        layers = sorted(layer for first, count in chunks for layer in range(first, first + count))
        records.append(
            StagePlan(
                pp=rank,
                first_layer=layers[0] if layers else None,
                last_layer=layers[-1] if layers else None,
                num_layers=len(layers),
                chunks=tuple(
                    ChunkPlan(vpp=v, first_layer=first, last_layer=first + count - 1, num_layers=count)
                    for v, (first, count) in enumerate(chunks)
                ),
            )
        )
    return tuple(records)


def layer_owner(num_layers: int, dims: PipelineSplit) -> dict[int, tuple[int, int]]:
    """layer index -> (pp rank, virtual chunk) that builds it."""
    owner = {}
    for rank, chunks in enumerate(chunk_layout(num_layers, dims)):
        for v, (first, count) in enumerate(chunks):
            for layer in range(first, first + count):
                owner[layer] = (rank, v)
    return owner
