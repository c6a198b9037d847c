"""Rank every candidate layout by estimated step time, then verify the best with the real rules until K pass.

Every candidate gets an estimate (the cached per-stage costs of specdraft.perf.estimate make that cheap); a base
whose memory lower bound (specdraft.plan.memory.peak_lower_bound, provably below the real peak) exceeds the HBM
is dropped unbuilt. Candidates then leave a heap best first, and each one runs the whole validation, memory
included (specdraft.assemble.check), until `top_k` have passed: the rules run on the few survivors that matter,
never on a second, faster copy of themselves.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from specdraft.perf.costs import Efficiency
from specdraft.perf.estimate import CALIBRATED, Estimator
from specdraft.perf.layout import Layout, StepEstimate
from specdraft.search.space import Split, bases, candidate_spec, splits
from specdraft.spec import derived
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec

MAX_MEMORY_FRACTION = 0.9  # of HBM; above it validation warns, and a search passes the layout over


@dataclass(frozen=True, kw_only=True)
class Row:
    """One verified layout: its full spec, the estimate and the real peak memory per GPU."""

    spec: LayoutSpec
    layout: Layout  # its dims are the compiled ParallelDims of ``spec``, split included
    estimate: StepEstimate
    peak_memory_bytes: int
    num_warnings: int


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The best layouts, best first, and what the search did to find them."""

    rows: tuple[Row, ...]
    num_candidates: int  # every (base, split, draft stage) enumerated
    num_pruned: int  # dropped by the memory lower bound, never built
    num_estimated: int  # given a step estimate (the rest were bounded out by better layouts)
    num_verified: int  # run through the whole validation
    num_rejected: int  # of those, refused (reasons counted in `rejections`)
    rejections: dict[str, int]
    seconds: float


def _draft_stages(spec: LayoutSpec, pp: int, pinned: bool) -> list[Optional[int]]:
    if not spec.draft.enabled:
        return [None]
    if pinned:
        index = derived.stage_index(spec.draft.stage, pp)
        return [index] if 0 <= index < pp else []
    return list(range(pp))


def _with_recompute(spec: LayoutSpec, recompute: str, cache: dict) -> LayoutSpec:
    """``spec`` with a base's recompute mode: the one setting besides the sizes that the memory bound reads (the
    sizes come from the base's dims). One copy per mode, since dataclasses.replace is the cost here."""
    hit = cache.get(recompute)
    if hit is None:
        hit = cache[recompute] = dataclasses.replace(
            spec, training=dataclasses.replace(spec.training, recompute=recompute)
        )
    return hit


class _Frontier:
    """Candidates in estimated-step-time order, expanding a base only when it could still beat the best waiting.

    Each base carries `Estimator.lower_bound`, below every split's and draft stage's estimate, so popping the heap
    only while its best is no worse than the next unexpanded base's bound yields exactly the global order.
    """

    def __init__(self, spec: LayoutSpec, pins: frozenset[str], estimator: Estimator, max_memory: float):
        from specdraft.plan.memory import peak_lower_bound

        self.spec, self.estimator = spec, estimator
        hbm = CATALOGUE[spec.cluster.gpu].hbm_bytes * max_memory
        pinned_stage = "draft.stage" in pins
        self.enumerated = self.pruned = self.estimated = 0
        self._splits: dict[int, list[Split]] = {}
        probes: dict[tuple, object] = {}
        waiting = []
        over = None  # (sizes, recompute) whose memory bound failed at a smaller micro batch
        for base in bases(spec, pins):
            d = base.dims
            pp_splits = self._splits.get(d.pp)
            if pp_splits is None:
                pp_splits = self._splits[d.pp] = splits(spec, d.pp, pins)
            m = d.num_microbatches
            # Megatron's interleaved schedule runs microbatches in groups of pp (schedules.py refuses others).
            usable = [sp for sp in pp_splits if not sp.vpp or (m >= d.pp and m % d.pp == 0)]
            stages = _draft_stages(spec, d.pp, pinned_stage)
            count = len(usable) * len(stages)
            self.enumerated += count
            if not count:
                continue
            # bases() lists micro batches in ascending order, and the bound's activations grow with them, so a
            # failed bound fails for every larger micro batch of the same sizes.
            sizes = (d.tp, d.cp, d.pp, d.dp, d.ep, d.etp, d.sequence_parallel, base.recompute)
            if sizes == over or peak_lower_bound(_with_recompute(spec, base.recompute, probes), d) > hbm:
                over = sizes
                self.pruned += count
                continue
            lay = Layout(base.dims, base.recompute, usable[0].chunks, None)
            bound = estimator.lower_bound(lay, max(sp.vpp or 1 for sp in usable))
            waiting.append((bound, len(waiting), base, usable, stages))
        waiting.sort()
        self._waiting = waiting
        self._next = 0
        self._heap: list = []
        self._count = 0

    def _expand(self, base, usable: list[Split], stages: list) -> None:
        """A base's splits enter the heap as groups bounded by their step without the draft (which only adds);
        a group is split into its draft placements when it reaches the top."""
        est, heap = self.estimator, self._heap
        for split in usable:
            lay = Layout(base.dims, base.recompute, split.chunks, None)
            pipe = est.pipeline(lay, detail=False)
            if stages == [None]:
                [(_, step)] = est.placements(lay, pipe, stages)
                heapq.heappush(heap, (step, self._order(), base, split, None))
                self.estimated += 1
            else:
                bound = est.placements(lay, pipe, [None])[0][1]
                heapq.heappush(heap, (bound, self._order(), base, split, (lay, pipe, stages)))

    def _order(self) -> int:
        self._count += 1
        return self._count

    def pop(self):
        """The next candidate (step seconds, order, base, split, draft stage), or None when none is left."""
        heap, waiting = self._heap, self._waiting
        while True:
            if self._next < len(waiting) and (not heap or waiting[self._next][0] <= heap[0][0]):
                _, _, base, usable, stages = waiting[self._next]
                self._next += 1
                self._expand(base, usable, stages)
                continue
            if not heap:
                return None
            entry = heapq.heappop(heap)
            if not isinstance(entry[4], tuple):
                return entry
            lay, pipe, stages = entry[4]
            for stage, step in self.estimator.placements(lay, pipe, stages):
                heapq.heappush(heap, (step, self._order(), entry[2], entry[3], stage))
                self.estimated += 1


def search(
    spec: LayoutSpec,
    top_k: int = 10,
    pins: frozenset[str] = frozenset(),
    eff: Efficiency = CALIBRATED,
    max_memory: float = MAX_MEMORY_FRACTION,
    max_verified: int | None = None,
) -> SearchResult:
    """The ``top_k`` best valid layouts of ``spec``'s model, cluster and batch, best first.

    A layout whose estimated peak exceeds ``max_memory`` of the HBM is passed over like an invalid one (the
    estimate leaves out the CUDA context, NCCL buffers and fragmentation; validation warns above 90%)."""
    from specdraft.assemble import check
    from specdraft.errors import SpecError
    from specdraft.plan.compile import parallel_dims, plan_memory
    from specdraft.spec.bounds import check as check_bounds

    out_of_bounds = check_bounds(spec)
    if out_of_bounds:  # no layout of it is valid, and adding nodes is not the fix: say which bound it breaks
        raise SpecError(out_of_bounds)
    started = time.perf_counter()
    hbm = CATALOGUE[spec.cluster.gpu].hbm_bytes
    estimator = Estimator(spec, eff)
    frontier = _Frontier(spec, pins, estimator, max_memory)
    rows: list[Row] = []
    rejections: Counter = Counter()
    verified = 0
    while len(rows) < top_k and (max_verified is None or verified < max_verified):
        entry = frontier.pop()
        if entry is None:
            break
        _, _, base, split, stage = entry
        layout_spec = candidate_spec(spec, base, split, stage)
        verified += 1
        errors, warnings = check(layout_spec)
        if errors:
            rejections[_reason(errors[0])] += 1
            continue
        dims = parallel_dims(layout_spec)
        lay = Layout(dims, base.recompute, split.chunks, stage)
        peak = max(s.total for s in plan_memory(layout_spec, dims))
        if peak > max_memory * hbm:
            rejections["memory headroom"] += 1
            continue
        rows.append(
            Row(
                spec=layout_spec,
                layout=lay,
                estimate=estimator.estimate(lay),
                peak_memory_bytes=peak,
                num_warnings=len(warnings),
            )
        )
    return SearchResult(
        rows=tuple(rows),
        num_candidates=frontier.enumerated,
        num_pruned=frontier.pruned,
        num_estimated=frontier.estimated,
        num_verified=verified,
        num_rejected=verified - len(rows),
        rejections=dict(rejections),
        seconds=time.perf_counter() - started,
    )


def _reason(problem) -> str:
    """A rejection's kind: the field path without indices (memory.stage[3] -> memory)."""
    return problem.path.split("[", 1)[0].split(".", 1)[0] if problem.path.startswith("memory") else problem.path
