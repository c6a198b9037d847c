"""Even out peak memory when the draft's stage is the heaviest: suggest first/last_stage_layers.

Pure search over the valid uneven splits of the draft's end stage; the best split minimises the peak stage.
"""

from __future__ import annotations

import dataclasses

from specdraft.plan.memory import stage_memory
from specdraft.plan.taps import draft_stage_index
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate import resolved_dp, stage_layer_counts


def _peak(spec: LayoutSpec) -> int | None:
    from specdraft.plan.compile import draft_slots, num_microbatches, sizes_of

    counts = stage_layer_counts(spec)
    if counts is None or min(counts) < 1:
        return None
    p = spec.parallel
    if p.vpp and p.vpp > 1 and any(c % p.vpp for c in counts):
        return None
    sizes = sizes_of(spec)
    m = num_microbatches(spec, sizes.dp)
    memory = stage_memory(spec, counts, sizes.dp, sizes.edp, m, draft_stage_index(spec), draft_slots(spec, m))
    return max(s["total"] for s in memory)


def suggest_balance(spec: LayoutSpec) -> dict | None:
    """{"field", "value", "override", "peak_before", "peak_after"} or None when nothing helps.

    Only a draft on the first or last stage can be balanced this way (Megatron's uneven split moves layers
    off exactly those two stages).
    """
    p, d = spec.parallel, spec.draft
    if not d.enabled or p.pp < 2 or resolved_dp(spec) is None:
        return None
    stage = draft_stage_index(spec)
    if stage not in (0, p.pp - 1):
        return None
    field = "last_stage_layers" if stage == p.pp - 1 else "first_stage_layers"
    before = _peak(spec)
    if before is None or not _draft_stage_heaviest(spec, stage):
        return None
    best = (before, getattr(p, field))
    for value in range(1, spec.model.num_layers):
        candidate = dataclasses.replace(spec, parallel=dataclasses.replace(p, **{field: value}))
        peak = _peak(candidate)
        if peak is not None and peak < best[0]:
            best = (peak, value)
    if best[1] == getattr(p, field):
        return None
    return {"field": f"parallel.{field}", "value": best[1], "override": f"parallel.{field}={best[1]}",
            "peak_before": before, "peak_after": best[0]}


def _draft_stage_heaviest(spec: LayoutSpec, stage: int) -> bool:
    from specdraft.plan.compile import draft_slots, num_microbatches, sizes_of

    sizes = sizes_of(spec)
    m = num_microbatches(spec, sizes.dp)
    memory = stage_memory(spec, stage_layer_counts(spec), sizes.dp, sizes.edp, m, stage, draft_slots(spec, m))
    return max(memory, key=lambda s: s["total"])["pp"] == stage


def apply_balance(spec: LayoutSpec, suggestion: dict) -> LayoutSpec:
    name = suggestion["field"].split(".", 1)[1]
    return dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, **{name: suggestion["value"]}))
