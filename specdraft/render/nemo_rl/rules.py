"""What the NeMo-RL profile refuses in a plan (as Problems naming the limit and what would lift it), and which
plan fields have no NeMo-RL key (listed in the render as not carried)."""

from __future__ import annotations

from typing import Any

from specdraft.errors import Problem
from specdraft.plan.model import LaunchPlan
from specdraft.render.nemo_rl.profile import NAME, NOT_CARRIED, RULES


def _problem(rule: str, path: str, value: Any, fix: str, severity: str) -> Problem:
    r = RULES[rule]
    return Problem(
        path=path,
        value=value,
        rule=f"NeMo-RL {NAME} refuses it: {r.limit} ({r.source})",
        fix=f"{fix} (what would lift the limit in NeMo-RL: {r.lift})",
        severity=severity,
    )


def refusals(plan: LaunchPlan, severity: str = "error") -> list[Problem]:
    """Every limit of the profile the plan runs into, each as one Problem (empty: NeMo-RL accepts it)."""
    d, p, t, r = plan.draft, plan.parallel, plan.training, plan.rollout_settings
    out: list[Problem] = []
    if d.enabled and p.cp > 1:
        out.append(
            _problem(
                "draft_cp",
                "parallel.cp",
                p.cp,
                "use parallel.cp=1 with training.packing=false, or draft.enabled=false",
                severity,
            )
        )
    elif d.enabled and t.packing:
        out.append(
            _problem(
                "draft_packing",
                "training.packing",
                True,
                "set training.packing=false, or draft.enabled=false",
                severity,
            )
        )
    if not d.enabled and p.cp > 1 and not t.packing:
        out.append(
            _problem("cp_packing", "training.packing", False, "set training.packing=true, or parallel.cp=1", severity)
        )
    if r.max_policy_lag >= 1 and r.colocated:
        out.append(
            _problem(
                "async_colocated",
                "rollout.max_policy_lag",
                r.max_policy_lag,
                "set rollout.colocated=false with rollout.num_nodes >= 1 (dedicated vLLM nodes), or "
                "rollout.max_policy_lag=0 (synchronous GRPO)",
                severity,
            )
        )
    return out


def not_carried(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(field, why) for every spec field without a NeMo-RL key, in a fixed order; model.moe_aux_loss_coeff only
    for a MoE model."""
    return [(f, why) for f, why in NOT_CARRIED.items() if f != "model.moe_aux_loss_coeff" or plan.model.num_experts]
