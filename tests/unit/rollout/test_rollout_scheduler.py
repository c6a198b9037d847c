"""Offline rollout schedules: every prompt once, groups kept together, steps kept apart, minibatches balanced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.rollout.model import costmodel, trainer
from specdraft.rollout.model.workload import LengthModel, synthetic
from specdraft.rollout.schedule import dispatch
from specdraft.rollout.schedule.asp import dp_layout
from specdraft.rollout.schedule.dispatch import CostHint
from specdraft.rollout.schedule.scheduler import POLICIES, build
from specdraft.spec.load import builtin_layout_text, load_layout_text

SPEC = load_layout_text(builtin_layout_text("qwen3-8b"), [], source="<built-in qwen3-8b>")
COST = costmodel.from_spec(SPEC)
TRAINER = trainer.from_spec(SPEC)
HINT = dispatch.hint_from_cost(COST, 1, 64)


@st.composite
def cases(draw):
    steps = draw(st.integers(1, 3))
    per_step = draw(st.integers(1, 12))
    n = draw(st.integers(1, 4))
    model = LengthModel(
        median=draw(st.sampled_from([50, 400, 3000])),
        sigma=draw(st.sampled_from([0.0, 0.5, 1.5])),
        cap=draw(st.sampled_from([200, 16384])),
        correlation=draw(st.sampled_from([0.0, 0.6, 1.0])),
    )
    work = synthetic(
        model, steps, per_step, n, 64, draw(st.integers(0, 10_000)), draw(st.sampled_from([0.0, 0.2, 1.0]))
    )
    return work, draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(0, 99))


@settings(max_examples=60, deadline=None)
@given(case=cases(), policy=st.sampled_from(POLICIES))
def test_every_prompt_scheduled_once_with_its_samples_kept_together(case, policy):
    work, instances, mb, seed = case
    sched = build(policy, work, instances, mb, hint=HINT, seed=seed, trainer=TRAINER)
    prompts = {p.pid: p for step in work for p in step}
    # Each prompt sits in exactly one queue (its samples run there, consecutively, as one vLLM request group).
    placed = [pid for queue in sched.queues for pid in queue]
    assert sorted(placed) == sorted(prompts)
    # Queues run step t before step t+1, so no later step can block an earlier one's release.
    for queue in sched.queues:
        steps = [prompts[pid].step for pid in queue]
        assert steps == sorted(steps)
    # Minibatches partition each step's samples, and a prompt's samples share one minibatch (GRPO groups).
    assert len(sched.minibatches) == len(work)
    for step, mbs in zip(work, sched.minibatches):
        samples = [key for m in mbs for key in m]
        assert sorted(samples) == sorted((p.pid, s) for p in step for s in range(len(p.lengths)))
        for m in mbs:
            pids = {pid for pid, _ in m}
            assert len(m) == sum(len(prompts[pid].lengths) for pid in pids)
            assert len(pids) <= mb


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_lpt_balances_predicted_cost_within_one_prompt(case):
    work, instances, _, _ = case
    step = work[0]
    loads = [0.0] * instances
    placed = dispatch.lpt(step, loads, HINT)
    costs = [sum(HINT.prompt(p) for p in group) for group in placed]
    biggest = max(HINT.prompt(p) for p in step)
    assert max(costs) - min(costs) <= biggest * (1 + 1e-9)
    assert loads == costs


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_dp_layout_evens_the_data_parallel_shares(case):
    work, _, mb, _ = case
    group = work[0][:mb]
    order = dp_layout(group, TRAINER)
    assert sorted(order) == sorted((p.pid, s) for p in group for s in range(len(p.lengths)))
    pred = {(p.pid, s): (p.prompt_len + x) for p in group for s, x in enumerate(p.predicted)}
    share = -(-len(order) // TRAINER.dp)
    parts = [order[r * share : (r + 1) * share] for r in range(TRAINER.dp)]
    loads = [sum(TRAINER.seq_flops(pred[k]) for k in part) for part in parts if part]
    biggest = max(TRAINER.seq_flops(v) for v in pred.values())
    if len(loads) == TRAINER.dp and all(len(p) == share for p in parts):
        assert max(loads) - min(loads) <= biggest * (1 + 1e-9)


def test_sorted_orders_shortest_first_and_asp_longest_first():
    work = synthetic(LengthModel(), 1, 32, 4, 64, seed=3, prediction_error=0.0)
    sorted_sched = build("sorted", work, 1, 4)
    preds = {p.pid: sum(p.predicted) for p in work[0]}
    assert [preds[pid] for pid in sorted_sched.queues[0]] == sorted(preds.values())
    asp = build("asp", work, 1, 4, hint=CostHint(), trainer=TRAINER)
    costs = [CostHint().prompt(p) for p in sorted(work[0], key=lambda p: asp.queues[0].index(p.pid))]
    assert costs == sorted(costs, reverse=True)


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_verl_splits_each_step_into_equal_contiguous_shares(case):
    """VeRL's split: per step, instance i takes the i-th contiguous share of the dataloader order; shares differ
    by at most one prompt, whatever the lengths."""
    work, instances, mb, _ = case
    sched = build("verl", work, instances, mb)
    cursor = [0] * instances
    for step in work:
        order = [p.pid for p in step]
        shares = []
        for i, queue in enumerate(sched.queues):
            mine = [pid for pid in queue[cursor[i] :] if pid in set(order)]
            cursor[i] += len(mine)
            shares.append(mine)
        assert [pid for share in shares for pid in share] == order
        sizes = [len(share) for share in shares]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
