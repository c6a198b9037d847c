"""TapChannel routes: which stage holds each draft tap, and one route per (source rank, draft-stage rank) pair.

A route pairs ranks with the same (tp, cp, dp) coordinates, so each draft rank receives exactly the token shard
and tensor-parallel slice its own draft forward consumes.
"""

from __future__ import annotations

from specdraft.plan.dims import ParallelDims
from specdraft.plan.grid import RankGrid
from specdraft.plan.memory import DTYPE_BYTES
from specdraft.plan.model import Tap, TapRoute, TapSummary
from specdraft.spec.derived import aux_layers
from specdraft.spec.schema import LayoutSpec


def tap_bytes(spec: LayoutSpec, dims: ParallelDims, tap: Tap) -> int:
    """Bytes one route carries per microbatch for ``tap``.

    A hidden-state tap is local tokens x hidden x dtype bytes. The embedding tap carries the embeddings of the
    tokens x_{p+1+j} the draft's TTT steps read: the streams overlap, so each token is sent once, about one row
    per local token (the runtime's exact count is data dependent: about one row fewer per packed sequence, plus
    up to 2*ttt_steps rows per chunk end under CP). The logits tap is the vocab-parallel slice of the logits.
    """
    m, dtype = spec.model, spec.training.dtype
    if tap == "logits":
        return dims.cp_tokens(m.seq_length) * (m.vocab_size // dims.tp) * DTYPE_BYTES[dtype]
    return dims.local_tokens(m.seq_length) * m.hidden_size * DTYPE_BYTES[dtype]


def tap_sources(
    spec: LayoutSpec, dims: ParallelDims, owner: dict[int, tuple[int, int]], draft_stage: int
) -> list[tuple[Tap, int, int]]:
    """Every tap the draft on ``draft_stage`` reads, with the (stage, chunk) that produces it."""
    taps: list[tuple[Tap, int, int]] = [("embedding", 0, 0)]
    for layer in aux_layers(spec):
        stage, chunk = owner[layer]
        taps.append((layer, stage, chunk))
    if draft_stage != dims.last_stage:
        # The draft's KL target (the policy's logits) is produced by the last stage's output layer.
        taps.append(("logits", dims.last_stage, dims.num_chunks - 1))
    return taps


def tap_routes(
    spec: LayoutSpec, grid: RankGrid, owner: dict[int, tuple[int, int]], draft_stage: int
) -> tuple[tuple[TapRoute, ...], tuple[TapSummary, ...]]:
    """(routes, per-tap summary) of the draft on ``draft_stage``. Local taps appear with ``local: true`` and
    src_rank == dst_rank."""
    s = grid.sizes
    dst_stage = draft_stage
    routes: list[TapRoute] = []
    summary: list[TapSummary] = []
    for tap, src_stage, src_chunk in tap_sources(spec, s, owner, draft_stage):
        local = src_stage == dst_stage
        nbytes = tap_bytes(spec, s, tap)
        count = cross = 0
        for dp in range(s.dp):
            for cp in range(s.cp):
                for tp in range(s.tp):
                    src = grid.rank_of(tp=tp, cp=cp, dp=dp, pp=src_stage)
                    dst = grid.rank_of(tp=tp, cp=cp, dp=dp, pp=dst_stage)
                    crossing = grid.node_of(src) != grid.node_of(dst)
                    routes.append(
                        TapRoute(
                            tap=tap,
                            src_rank=src,
                            dst_rank=dst,
                            src_stage=src_stage,
                            src_chunk=src_chunk,
                            dst_stage=dst_stage,
                            bytes_per_microbatch=nbytes,
                            cross_node=crossing,
                            local=local,
                        )
                    )
                    count += 1
                    cross += crossing
        num_routes = 0 if local else count
        summary.append(
            TapSummary(
                tap=tap,
                src_stage=src_stage,
                src_chunk=src_chunk,
                dst_stage=dst_stage,
                local=local,
                num_routes=num_routes,
                num_cross_node=cross,
                bytes_per_microbatch=nbytes,
                bytes_per_step=nbytes * num_routes * s.num_microbatches,
            )
        )
    return tuple(routes), tuple(summary)


def pipeline_activation_bytes_per_step(spec: LayoutSpec, grid: RankGrid) -> int:
    """The pipeline's own P2P traffic per step, summed over ranks: activations forward + grads backward."""
    s = grid.sizes
    boundaries = s.pp * s.num_chunks - 1
    per_rank = s.local_tokens(spec.model.seq_length) * spec.model.hidden_size * DTYPE_BYTES[spec.training.dtype]
    return 2 * boundaries * per_rank * s.num_microbatches * s.tp * s.cp * s.dp
