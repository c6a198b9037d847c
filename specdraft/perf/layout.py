"""What the step estimate takes and gives: a candidate `Layout` (its ParallelDims, recompute mode, layer split and
draft stage) and the `StepEstimate` with its breakdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from specdraft.plan.dims import ParallelDims
from specdraft.spec.schema import LayoutSpec

BREAKDOWN_KEYS = (
    "compute_s",
    "tp_sp_comm_s",
    "cp_ring_s",
    "ep_a2a_s",
    "pp_p2p_s",
    "pp_bubble_s",
    "dp_comm_s",
    "optimizer_s",
    "tapchannel_s",
    "draft_s",
)


class Layout(NamedTuple):
    """One candidate: ``dims`` gives its sizes and ``chunks[stage][v]`` the layer count of virtual chunk v on each
    stage (a search varies the split under one dims, so the estimate reads the split from ``chunks`` only)."""

    dims: ParallelDims
    recompute: str
    chunks: tuple[tuple[int, ...], ...]
    draft_stage: Optional[int]

    @property
    def vpp(self) -> int:
        """Model chunks per stage in ``chunks`` (1 without interleaving)."""
        return len(self.chunks[0])


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    """One layout's estimate: seconds per step, throughput, MFU and where the time goes (sums to the step)."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    breakdown: dict[str, float]


def layout_of(spec: LayoutSpec) -> Layout:
    """The `Layout` of a spec that passed validation."""
    from specdraft.plan.compile import parallel_dims
    from specdraft.plan.stages import chunk_layout
    from specdraft.spec.derived import draft_stage_index

    dims = parallel_dims(spec)
    return Layout(
        dims=dims,
        recompute=spec.training.recompute,
        chunks=tuple(tuple(count for _, count in stage) for stage in chunk_layout(spec.model.num_layers, dims)),
        draft_stage=draft_stage_index(spec) if spec.draft.enabled else None,
    )
