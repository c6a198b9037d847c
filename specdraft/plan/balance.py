"""Even out peak memory when the draft's stage is the heaviest: suggest first/last_stage_layers.

Pure search over the valid uneven splits of the draft's end stage; the best split minimises the peak stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specdraft.plan.compile import plan_memory
from specdraft.spec.derived import draft_stage_index, resolved_dp
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate.parallel import stage_layer_counts


@dataclass(frozen=True, kw_only=True)
class BalanceSuggestion:
    """An uneven split that lowers the peak stage memory."""

    field: str  # parallel.first_stage_layers or parallel.last_stage_layers
    value: int
    peak_before: int  # bytes per GPU on the heaviest stage
    peak_after: int

    @property
    def override(self) -> str:
        return f"{self.field}={self.value}"


def _peak(spec: LayoutSpec) -> int | None:
    counts = stage_layer_counts(spec)
    if counts is None or min(counts) < 1:
        return None
    p = spec.parallel
    if p.vpp and p.vpp > 1 and any(c % p.vpp for c in counts):
        return None
    return max(s.total for s in plan_memory(spec))


def suggest_balance(spec: LayoutSpec) -> BalanceSuggestion | None:
    """The split that evens peak memory, or None when nothing helps.

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
    if before is None or max(plan_memory(spec), key=lambda s: s.total).pp != stage:
        return None
    best = (before, getattr(p, field))
    for value in range(1, spec.model.num_layers):
        candidate = dataclasses.replace(spec, parallel=dataclasses.replace(p, **{field: value}))
        peak = _peak(candidate)
        if peak is not None and peak < best[0]:
            best = (peak, value)
    if best[1] == getattr(p, field):
        return None
    return BalanceSuggestion(field=f"parallel.{field}", value=best[1], peak_before=before, peak_after=best[0])


def apply_balance(spec: LayoutSpec, suggestion: BalanceSuggestion) -> LayoutSpec:
    name = suggestion.field.split(".", 1)[1]
    return dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, **{name: suggestion.value}))
