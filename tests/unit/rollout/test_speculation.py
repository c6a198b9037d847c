"""Speculation that pays: rollout.adaptive_k's k per running batch (rollout/model/kchoice.py) against a brute-force
search, the schedule vLLM validates, the plan and its vLLM render, the running job's control
(runtime/rl/speculation.py); and draft.refit_policy drift's decision (runtime/rl/drift.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.plan.model import LaunchPlan
from specdraft.rollout.model import kchoice
from specdraft.spec.load import load_layout
from tests.support.paths import SHIPPED

GRPO = SHIPPED / "grpo-tiny-cpu.yaml"


@st.composite
def acceptance_and_costs(draw):
    max_k = draw(st.integers(1, 6))
    # vLLM's per-position rates: position j+1 accepts only after position j, so they never rise
    rates = sorted(draw(st.lists(st.floats(0, 1), min_size=0, max_size=max_k + 2)), reverse=True)
    batches = sorted(set(draw(st.lists(st.integers(1, 300), min_size=1, max_size=8))))
    rows = [(b, tuple(draw(st.lists(st.floats(1e-4, 10), min_size=max_k + 1, max_size=max_k + 1)))) for b in batches]
    max_batch = draw(st.integers(1, 400))
    allowed = draw(st.one_of(st.none(), st.frozensets(st.integers(1, max_k))))
    return rates, rows, max_k, max_batch, allowed


def _brute_k(rates, seconds, max_k, allowed) -> int:
    """Every k, by its expected tokens per second; the first of the best."""
    options = [k for k in range(max_k + 1) if k == 0 or allowed is None or k in allowed]
    rate = {k: (1 + sum((list(rates) + [0.0] * max_k)[:k])) / seconds[k] for k in options}
    top = max(rate.values())
    return min(k for k in options if rate[k] >= top * (1 - 1e-9))


@settings(max_examples=300, deadline=None)
@given(acceptance_and_costs())
def test_the_choice_of_k_is_the_brute_force_search_at_every_batch(case):
    rates, rows, max_k, max_batch, allowed = case
    schedule = kchoice.k_schedule(rates, rows, max_k, max_batch, allowed)
    # ranges from 1, contiguous, to max_batch, and neighbours differ (merged)
    assert schedule[0][0] == 1 and schedule[-1][1] == max_batch
    assert all(a[1] + 1 == b[0] and a[2] != b[2] for a, b in zip(schedule, schedule[1:]))
    for b in range(1, max_batch + 1):
        (k,) = [k for first, last, k in schedule if first <= b <= last]
        row = next((seconds for batch, seconds in rows if batch >= b), rows[-1][1])  # the next row up, else the last
        assert k == _brute_k(rates, row, max_k, allowed), b


def test_tokens_per_verify_counts_the_targets_token_and_each_accepted_draft():
    assert kchoice.tokens_per_verify([0.9, 0.5, 0.1], 0) == 1.0
    assert kchoice.tokens_per_verify([0.9, 0.5, 0.1], 2) == pytest.approx(2.4)
    # bandwidth-bound (a verify costs what a plain step does): draft while it adds tokens; compute-bound (a verify
    # of k+1 tokens costs k+1 steps): never
    assert kchoice.best_k([0.9, 0.5, 0.1], lambda k: 1.0 + 0.01 * k, 3) == 3
    assert kchoice.best_k([0.9, 0.5, 0.1], lambda k: 1.0 + k, 3) == 0


def test_vllm_takes_the_schedule():
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    schedule = kchoice.k_schedule([0.8, 0.5, 0.2], [(1, (1.0, 1.1, 1.2, 1.3)), (8, (1.0, 1.9, 2.8, 3.7))], 3, 64)
    assert schedule == ((1, 1, 3), (2, 64, 0))
    lookup = utils.build_dynamic_sd_schedule_lookup([list(r) for r in schedule], 64, 3)
    assert lookup[1:] == [3] + [0] * 63


def test_the_plan_carries_the_models_schedule_and_the_vllm_render_passes_it_on():
    plan = compile(load_layout(GRPO, ["rollout.adaptive_k=true"]))
    adaptive = plan.rollout.adaptive_k
    assert adaptive.source == "model" and adaptive.max_k == plan.rollout_settings.num_speculative_tokens
    assert [b for b, _ in adaptive.costs] == list(kchoice.batch_points(plan.rollout_settings.max_num_seqs))
    assert adaptive.schedule == kchoice.k_schedule(
        kchoice.geometric(plan.rollout.acceptance_rate, adaptive.max_k), adaptive.costs, adaptive.max_k, 32
    )
    rendered = plan.renders.vllm.engine_args["speculative_config"]
    assert rendered["num_speculative_tokens_per_batch_size"] == [list(r) for r in adaptive.schedule]
    assert LaunchPlan.from_json(plan.to_json()) == plan
    assert compile(load_layout(GRPO, ["rollout.adaptive_k=true"])).to_json() == plan.to_json()
    # off: no schedule, and vLLM's engine arguments are as before (no key)
    plain = compile(load_layout(GRPO))
    assert plain.rollout.adaptive_k is None
    assert "num_speculative_tokens_per_batch_size" not in plain.renders.vllm.engine_args["speculative_config"]


def test_adaptive_k_without_speculation_is_refused_naming_the_field():
    with pytest.raises(SpecError) as err:
        compile(load_layout(GRPO, ["rollout.adaptive_k=true", "rollout.speculative=false"]))
    assert (
        "rollout.adaptive_k = True: chooses how many draft tokens to verify, but the instances do not speculate "
        "(rollout.speculative: false, draft.enabled: true)" in str(err.value)
    )


class _Engine:
    """What a lead's engine is told (the engines' own tests check that they follow it)."""

    def __init__(self):
        self.told = []

    def set_k_schedule(self, schedule):
        self.told.append(tuple(schedule))


def test_each_instance_rederives_its_schedule_from_what_it_measured():
    from specdraft.runtime.rl.speculation import KControl

    plan = compile(load_layout(GRPO, ["rollout.adaptive_k=true"]))
    control = KControl(plan, 2)
    engine = _Engine()
    control.apply(engine, 1)
    assert engine.told == [plan.rollout.adaptive_k.schedule]
    perfect = {"drafts": 10, "accepted_per_pos": [10, 10, 10]}  # every draft accepted: k 3 pays longest
    idle = {"drafts": 0, "accepted_per_pos": [0, 0, 0]}  # nothing drafted: nothing measured
    rows = [dict(perfect), dict(idle)]
    control.observe(rows)
    assert [r["k_schedule"] for r in rows] == [[list(r) for r in plan.rollout.adaptive_k.schedule]] * 2
    assert control.schedules[1] == plan.rollout.adaptive_k.schedule
    costs, max_k = plan.rollout.adaptive_k.costs, plan.rollout.adaptive_k.max_k
    assert control.schedules[0] == kchoice.k_schedule([1.0, 1.0, 1.0], costs, max_k, 32)
    assert control.schedules[0] != plan.rollout.adaptive_k.schedule
    assert json.dumps(rows)  # metrics.jsonl takes it as it is
    assert KControl(compile(load_layout(GRPO)), 2).schedules == [None, None]  # off: engines keep their k


def test_a_drift_refit_is_decided_by_the_margin_with_its_reason():
    from specdraft.runtime.rl import drift

    instances = [{"drafts": 10, "accepted": 5}, {"drafts": 30, "accepted": 15}]
    assert drift.engine_accept_length(instances) == 1.5
    assert drift.engine_accept_length([{"drafts": 0, "accepted": 0}]) is None
    forced_down = drift.decide(1.5, 2.0, 0.2)  # a stale or perturbed draft in the engines
    assert forced_down["refit"] and forced_down["reason"] == "drift: engines 1.500 < training 2.000 - 0.2"
    holding = drift.decide(1.9, 2.0, 0.2)
    assert not holding["refit"] and holding["reason"] == "held: engines 1.900 >= training 2.000 - 0.2"
    unmeasured = drift.decide(None, 2.0, 0.2)
    assert unmeasured["refit"] and unmeasured["reason"].startswith("unmeasured (the engines drafted nothing)")


def test_a_negative_drift_margin_is_refused_naming_the_field():
    with pytest.raises(SpecError, match=r"draft.refit_drift_margin = -0.1: must be >= 0"):
        compile(load_layout(GRPO, ["draft.refit_drift_margin=-0.1"]))
