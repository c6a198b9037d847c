"""The layer-to-stage map: which (pp rank, virtual chunk) builds each transformer layer, exactly as Megatron does.

Mirrors megatron-core 0.16 `get_transformer_layer_offset` / `get_num_layers_to_build` for even, uneven
(first/last stage) and interleaved (vpp) splits; tests check it against megatron-core itself.
"""

from __future__ import annotations

from specdraft.plan.model import ChunkPlan, StagePlan
from specdraft.spec.accounting import split_accounting
from specdraft.spec.derived import vpp as resolved_vpp
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate import stage_layer_counts


def chunk_layout(spec: LayoutSpec) -> list[list[tuple[int, int]]]:
    """Per pp rank, per virtual chunk: (first_layer, num_layers). One chunk per rank without vpp."""
    p, n = spec.parallel, spec.model.num_layers
    counts = stage_layer_counts(spec)
    if counts is None:
        raise ValueError("invalid pipeline split; run validation first")
    vpp = resolved_vpp(p) or 1
    if split_accounting(p) != (0, 0):
        return _accounted_chunks(spec, vpp)
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


def _accounted_chunks(spec: LayoutSpec, vpp: int) -> list[list[tuple[int, int]]]:
    """The split with the embedding and/or loss counted as layers: every chunk holds (N + e + l) / (pp * vpp)
    slots; the embedding takes the first slot of (stage 0, chunk 0), the loss the last of the last chunk."""
    p = spec.parallel
    e, loss = split_accounting(p)
    total = spec.model.num_layers + e + loss
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


def stage_records(spec: LayoutSpec) -> tuple[StagePlan, ...]:
    """The plan's `stages`: first/last layer (0-indexed, inclusive) per pp rank, and its chunks in schedule order."""
    records = []
    for rank, chunks in enumerate(chunk_layout(spec)):
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


def layer_owner(spec: LayoutSpec) -> dict[int, tuple[int, int]]:
    """layer index -> (pp rank, virtual chunk) that builds it."""
    owner = {}
    for rank, chunks in enumerate(chunk_layout(spec)):
        for v, (first, count) in enumerate(chunks):
            for layer in range(first, first + count):
                owner[layer] = (rank, v)
    return owner
