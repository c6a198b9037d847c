"""Adaptive TP for the generation tail: the predictor, the switch rule, overhead accounting and the targets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.rollout.model import costmodel
from specdraft.rollout.model.workload import LENGTH_PRESETS, LengthModel, synthetic, uniform
from specdraft.rollout.report.compare import SimulateOptions, run
from specdraft.rollout.schedule.adaptive_tp import (
    PlannerConfig,
    RemainingPredictor,
    merge_overhead,
    predict_makespan,
    reshard_bytes,
    run_requests,
)
from specdraft.rollout.sim.generation import GenConfig, choose_start, simulate_generation
from specdraft.spec.load import builtin_layout_text, load_layout, load_layout_text
from tests.support.paths import SHIPPED

LAYOUTS = SHIPPED
SPEC = load_layout_text(builtin_layout_text("qwen3-8b"), [], source="<built-in qwen3-8b>")
COST = costmodel.from_spec(SPEC)


def planner(scale=1.0, sigma=0.2, mode="request", **kw):
    return PlannerConfig(predictor=RemainingPredictor(mode=mode, sigma=sigma), overhead_scale=scale, **kw)


def adaptive(prompts, scale=1.0, every=64, tp=1, **kw):
    cfg = GenConfig(cost=COST, gpus_per_node=8, planner=planner(scale, **kw), check_every_steps=every)
    return simulate_generation(cfg, prompts, tp)


@settings(max_examples=50, deadline=None)
@given(
    predicted=st.floats(10, 16384),
    generated=st.floats(0, 16000),
    sigma=st.floats(0.01, 1.5),
    mode=st.sampled_from(["request", "population"]),
)
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
@given(per=st.sampled_from([8, 16, 32]), n=st.integers(1, 4), length=st.integers(50, 4000), tp=st.sampled_from([1, 2]))
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
@given(
    seed=st.integers(0, 1000),
    per=st.integers(4, 24),
    scale=st.sampled_from([0.5, 1.0, 4.0]),
    every=st.sampled_from([16, 64]),
)
def test_every_request_finishes_once_and_overheads_add_up(seed, per, scale, every):
    prompts = synthetic(LengthModel(median=1500, cap=8192), 1, per, 4, 512, seed, 0.3)[0]
    _check_run(adaptive(prompts, scale=scale, every=every))


def test_default_step_switches_and_its_overheads_add_up():
    prompts = synthetic(LengthModel(cap=16384), 1, 64, 8, 1024, 0, 0.2)[0]
    out = adaptive(prompts)
    assert out.switches, "the long-tail step should trigger at least one merge"
    _check_run(out)


def _check_run(out, predicted=True):
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
        if predicted:
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


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.floats(100, 20000), st.floats(1, 16000)), min_size=1, max_size=40),
    tp=st.sampled_from([1, 2, 4, 8]),
    frac=st.floats(0.0, 1.0),
)
def test_running_part_way_then_on_adds_up_to_the_whole_run(reqs, tp, frac):
    """The planner's deferral runs groups for a while, then predicts the rest: the two parts equal one run."""
    whole = predict_makespan(COST, tp, reqs)
    spent, survivors = run_requests(COST, tp, reqs, frac * whole)
    assert spent <= whole * (1 + 1e-9) and len(survivors) <= len(reqs)
    assert all(rem > -1e-6 for _, rem in survivors)
    assert spent + predict_makespan(COST, tp, survivors) == pytest.approx(whole, rel=1e-6, abs=1e-9)


def test_scripted_switches_merge_every_block_and_keep_the_books():
    prompts = synthetic(LengthModel(median=1500, cap=8192), 1, 16, 4, 512, 3, 0.2)[0]
    out = simulate_generation(GenConfig(cost=COST, gpus_per_node=8, script=((1.0, 2), (3.0, 8))), prompts, 1)
    _check_run(out, predicted=False)
    assert [sw["to"]["tp"] for sw in out.switches] == [2, 2, 2, 2, 8]


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 1000),
    groups=st.sampled_from([(4, 1, 1, 1, 1), (2, 2, 1, 1, 1, 1), (4, 2, 1, 1)]),
    wide=st.integers(0, 40),
    merges=st.booleans(),
)
def test_a_heterogeneous_start_places_every_request_once(seed, groups, wide, merges):
    """The benchmark's heterogeneous starts: the predicted-longest go wide, nothing is lost or run twice."""
    prompts = synthetic(LengthModel(median=1500, cap=8192), 1, 16, 4, 512, seed, 0.2)[0]
    cfg = GenConfig(
        cost=COST, gpus_per_node=8, start_groups=groups, wide_first=wide, planner=planner() if merges else None
    )
    out = simulate_generation(cfg, prompts, groups[0])
    _check_run(out)
    assert out.start_tp == groups[0]


def test_a_heterogeneous_start_must_fill_the_node_widest_first():
    prompts = synthetic(LengthModel(median=1500, cap=8192), 1, 4, 2, 512, 0, 0.2)[0]
    for bad in [(4, 2, 1), (1, 4, 1, 1, 1), (3, 3, 2)]:
        with pytest.raises(ValueError, match="powers of two, widest first"):
            simulate_generation(GenConfig(cost=COST, gpus_per_node=8, start_groups=bad), prompts, 1)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 1000), per=st.integers(4, 16))
def test_the_start_is_the_dry_runs_best_and_exact_predictions_never_lose_to_a_static_tp(seed, per):
    """choose_start dry-runs every candidate on the predicted lengths. With exact predictions the static dry runs
    are the real runs, so the choice is at least as fast as every static TP (up to the adaptive dry runs' coarser
    checks); a step without length skew, evenly divisible over every TP, never asks for merges."""
    prompts = synthetic(LengthModel(median=1500, cap=8192), 1, per, 4, 512, seed, 0.0)[0]
    cfg = GenConfig(cost=COST, gpus_per_node=8, planner=planner(sigma=0.05))
    start, merges = choose_start(cfg, prompts, [1, 2, 4, 8])
    chosen = simulate_generation(cfg if merges else GenConfig(cost=COST, gpus_per_node=8), prompts, start).makespan_s
    static = min(
        simulate_generation(GenConfig(cost=COST, gpus_per_node=8), prompts, tp).makespan_s for tp in (1, 2, 4, 8)
    )
    assert chosen <= 1.01 * static, (start, merges, chosen, static)
    flat = uniform(1, 16, 4, 512, 1500)[0]
    assert choose_start(cfg, flat, [1, 2, 4, 8])[1] is False


def _generation(seeds, **kw):
    out = []
    for seed in seeds:
        prompts = synthetic(LengthModel(cap=16384), 1, 64, 8, 1024, seed, 0.2)[0]
        static = {
            tp: simulate_generation(GenConfig(cost=COST, gpus_per_node=8), prompts, tp).makespan_s
            for tp in (1, 2, 4, 8)
        }
        out.append((static, adaptive(prompts, **kw).makespan_s))
    return out


def test_adaptive_beats_the_layouts_static_tp_and_every_static_tp():
    """Seeds 0-2 of the default workload, adaptive from TP1: >= 10% faster than the layout's static tp 1 (PAT's
    baseline) and >= 2% faster than the best static TP in hindsight (docs/rollout.md); deferring merges helps."""
    without = _generation(range(3), defer_fractions=())
    for (static, adapt), (_, eager) in zip(_generation(range(3)), without):
        assert adapt <= 0.90 * static[1], (static, adapt)
        assert adapt <= 0.98 * min(static.values()), (static, adapt)
        assert adapt <= eager, (adapt, eager)


def _targets(path: str, lengths: str, seeds: int) -> dict:
    """`rollout simulate --adaptive-tp`'s generation report (the target keys) on seeds 0..seeds-1."""
    median, sigma, correlation = LENGTH_PRESETS[lengths]
    opts = SimulateOptions(
        seeds=seeds,
        steps=1,
        policies=(),
        adaptive_tp=True,
        lengths=lengths,
        median=median,
        sigma=sigma,
        correlation=correlation,
    )
    return run(load_layout(SHIPPED / path), opts).data["generation"]


def test_targets_on_the_default_workload():
    """Seeds 0-3 of the default workload. Over 20 seeds (docs/rollout.md) adaptive is 0.796x the verl baseline and
    0.939x the best static TP (targets 0.80x and 0.95x); these 4 seeds hold the best-static target and 0.85x verl (the
    verl ratio varies 0.71-0.88x per seed: VeRL's even split is sometimes lucky)."""
    gen = _targets("qwen3-8b.yaml", "long-tail", 4)
    ad = gen["adaptive"]
    assert ad["x_best_static"] <= 0.95 and ad["worst_seed_x"]["best_static"] <= 0.97, ad
    assert ad["x_verl"] <= 0.85 and ad["worst_seed_x"]["verl"] <= 0.90, ad
    assert gen["verl"]["tp"] == 2 and gen["verl"]["gpu_memory_utilization"] == 0.5


def test_targets_on_the_paper_like_qwen3_14b_regime():
    """Seeds 0-4 of qwen3-14b-pat with DeepScaleR-like lengths: at most 0.75x the verl baseline and never more than
    1.01x the best static TP (20 seeds: 0.688x and 0.996x, docs/rollout.md; per seed 0.59-0.78x verl)."""
    ad = _targets("qwen3-14b-pat.yaml", "deepscaler", 5)["adaptive"]
    assert ad["x_verl"] <= 0.75, ad
    assert ad["x_best_static"] <= 1.01, ad
