"""Adaptive TP for the generation tail: the predictor, the switch rule, overhead accounting and the targets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.rollout import costmodel
from specdraft.rollout.adaptive_tp import PlannerConfig, RemainingPredictor, merge_overhead, reshard_bytes
from specdraft.rollout.generation import GenConfig, simulate_generation
from specdraft.rollout.workload import LengthModel, synthetic, uniform
from specdraft.spec.load import builtin_layout_text, load_layout_text

SPEC = load_layout_text(builtin_layout_text("qwen3-8b"), [], source="<built-in qwen3-8b>")
COST = costmodel.from_spec(SPEC)


def planner(scale=1.0, sigma=0.2, mode="request"):
    return PlannerConfig(predictor=RemainingPredictor(mode=mode, sigma=sigma), overhead_scale=scale)


def adaptive(prompts, scale=1.0, every=64, tp=1):
    cfg = GenConfig(cost=COST, gpus_per_node=8, planner=planner(scale), check_every_steps=every)
    return simulate_generation(cfg, prompts, tp)


@settings(max_examples=50, deadline=None)
@given(predicted=st.floats(10, 16384), generated=st.floats(0, 16000), sigma=st.floats(0.01, 1.5),
       mode=st.sampled_from(["request", "population"]))
def test_remaining_length_is_a_conditional_median(predicted, generated, sigma, mode):
    pred = RemainingPredictor(mode=mode, sigma=sigma, cap=16384)
    rem = pred.remaining(predicted, generated)
    assert 0 <= rem <= 16384 - generated + 1
    if generated + 1 < 16384:
        assert rem >= min(1.0, 16384 - generated) - 1e-9  # an unfinished request has at least a token to go
    # The conditional median of L given L > g never falls as g grows: more generated, never a shorter total.
    later = generated + 500
    assert generated + rem <= later + pred.remaining(predicted, later) + 1e-6


@settings(max_examples=15, deadline=None)
@given(per=st.sampled_from([8, 16, 32]), n=st.integers(1, 4), length=st.integers(50, 4000),
       tp=st.sampled_from([1, 2]))
def test_no_length_skew_never_switches(per, n, length, tp):
    prompts = uniform(1, per, n, 256, length)[0]
    out = adaptive(prompts, every=16, tp=tp)
    assert out.switches == []


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), per=st.integers(4, 24))
def test_prohibitive_overhead_never_switches(seed, per):
    prompts = synthetic(LengthModel(cap=16384), 1, per, 4, 512, seed, 0.2)[0]
    assert adaptive(prompts, scale=1e6).switches == []


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), per=st.integers(4, 24), scale=st.sampled_from([0.5, 1.0, 4.0]),
       every=st.sampled_from([16, 64]))
def test_every_request_finishes_once_and_overheads_add_up(seed, per, scale, every):
    prompts = synthetic(LengthModel(median=1500, cap=8192), 1, per, 4, 512, seed, 0.3)[0]
    _check_run(adaptive(prompts, scale=scale, every=every))


def test_default_step_switches_and_its_overheads_add_up():
    prompts = synthetic(LengthModel(cap=16384), 1, 64, 8, 1024, 0, 0.2)[0]
    out = adaptive(prompts)
    assert out.switches, "the long-tail step should trigger at least one merge"
    _check_run(out)


def _check_run(out):
    assert out.finished == out.requests == len(out.finish_counts)
    assert set(out.finish_counts.values()) == {1}
    assert out.generated_tokens == pytest.approx(out.accounted_tokens, rel=1e-6)
    charged = 0.0
    for sw in out.switches:
        ov = sw["overhead_s"]
        assert ov["total"] == pytest.approx(ov["reshard"] + ov["group_setup"] + ov["kv"])
        assert ov["kv"] == pytest.approx(sum(r["seconds"] for r in sw["requests"]))
        assert len(sw["requests"]) >= sw["to"]["running"]
        assert sum(g["tp"] for g in sw["from"]) == sw["to"]["tp"]
        assert sw["predicted_makespan_s"]["switch"] < sw["predicted_makespan_s"]["stay"]
        charged += ov["total"]
    assert out.overhead_s == pytest.approx(charged)


def test_kv_move_picks_the_cheaper_of_migration_and_recompute():
    ov = merge_overhead(COST, [1, 1], 2, [(0, 1, 4000), (1, 1, 10)])
    for rid, action, seconds in ov.moves:
        ctx = {0: 4000, 1: 10}[rid]
        migrate = ctx * COST.target.kv_bytes_per_token * 0.5 / COST.link_bw
        recompute = COST.prefill(2, ctx)
        assert seconds == pytest.approx(min(migrate, recompute))
        assert action == ("migrate" if migrate <= recompute else "recompute")
    slow = merge_overhead(COST, [1, 1], 2, [(0, 1, 4000)], scale=3.0)
    assert slow.total_s == pytest.approx(3.0 * ov.reshard_s + 3.0 * ov.moves[0][2])
    assert reshard_bytes([1, 1], 2, 1e9) == 0 and reshard_bytes([2, 2], 4, 1e9) == 0
    assert reshard_bytes([4], 2, 1e9) == 5e8  # a split is not nested: the new shard must travel


def _generation(seeds):
    out = []
    for seed in seeds:
        prompts = synthetic(LengthModel(cap=16384), 1, 64, 8, 1024, seed, 0.2)[0]
        static = {tp: simulate_generation(GenConfig(cost=COST, gpus_per_node=8), prompts, tp).makespan_s
                  for tp in (1, 2, 4, 8)}
        out.append((static, adaptive(prompts).makespan_s))
    return out


def test_adaptive_beats_the_layouts_static_tp_and_every_static_tp():
    """Seeds 0-2 of the default workload: >= 20% faster than the layout's static tp 1 (PAT's baseline) and
    faster than the best static TP in hindsight (by ~2-3%, see the next test and docs/rollout.md)."""
    for static, adapt in _generation(range(3)):
        assert adapt <= 0.80 * static[1], (static, adapt)
        assert adapt < min(static.values()), (static, adapt)


@pytest.mark.xfail(strict=True, reason="issue target not reached by the cost model: static TP8 already gives the "
                   "long responses most of the speed-up, so adaptive TP gains ~2-3% over it (docs/rollout.md)")
def test_adaptive_cuts_20_percent_against_the_best_static_tp():
    for static, adapt in _generation(range(3)):
        assert adapt <= 0.80 * min(static.values()), (static, adapt)
