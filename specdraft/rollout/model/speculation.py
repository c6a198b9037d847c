"""The plan's k-by-batch schedule (rollout.adaptive_k): the calibrated cost model's step costs by batch and k, and
the schedule they give at rollout.acceptance_rate (rollout/model/kchoice.py chooses)."""

from __future__ import annotations

import dataclasses

from specdraft.plan.rollout import AdaptiveK, RolloutPlan
from specdraft.rollout.model import kchoice
from specdraft.rollout.model.costmodel import from_spec
from specdraft.spec.derived import num_speculative_tokens
from specdraft.spec.schema import LayoutSpec


def adaptive_k(spec: LayoutSpec) -> AdaptiveK:
    """The costs at a context of the prompt plus half the longest response, every position accepting at
    rollout.acceptance_rate given the one before."""
    r = spec.rollout
    max_k = num_speculative_tokens(spec)
    context = r.prompt_length + r.max_response_length / 2
    costs = kchoice.model_costs(from_spec(spec), r.tp, context, max_k)
    return AdaptiveK(
        source="model",
        max_k=max_k,
        mean_context=context,
        costs=costs,
        schedule=kchoice.k_schedule(kchoice.geometric(r.acceptance_rate, max_k), costs, max_k, r.max_num_seqs),
    )


def with_adaptive_k(spec: LayoutSpec, rollout: RolloutPlan | None) -> RolloutPlan | None:
    """``rollout`` (instances.plan_rollout's) with its adaptive_k when the layout asks for one."""
    if rollout is None or not spec.rollout.adaptive_k:
        return rollout
    return dataclasses.replace(rollout, adaptive_k=adaptive_k(spec))
