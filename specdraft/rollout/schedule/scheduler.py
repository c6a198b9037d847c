"""Offline rollout schedules: which instance runs each sample, in what order, and how minibatches are grouped.

Policies: verl (VeRL's even contiguous split), fifo, random, sorted (SortedRL-like), longest_first (balancing
only), asp (the length-aware scheduler of docs/rollout.md) and oracle (asp fed the true lengths). Every policy
keeps the n samples of a prompt together: on one instance, consecutive in its queue, and in one training
minibatch (GRPO needs the whole group for its advantage). No policy moves a prompt to another RL step: the
dataloader's step membership is never changed.
"""

from __future__ import annotations

import random

from specdraft.rollout.model.workload import Prompt, Workload, with_predictions
from specdraft.rollout.schedule.asp import asp_schedule
from specdraft.rollout.schedule.dispatch import CostHint, Schedule, chunks, even_shares, lpt

POLICIES = ("verl", "fifo", "random", "sorted", "longest_first", "asp", "oracle")


def _expand(order: list[Prompt]) -> list[tuple[int, int]]:
    return [(p.pid, s) for p in order for s in range(len(p.lengths))]


def _groups(order: list[Prompt], mb: int) -> list[list[tuple[int, int]]]:
    """Minibatches of ``mb`` consecutive prompts, each prompt's samples contiguous."""
    return [_expand(c) for c in chunks(order, mb)]


def _round_robin(orders: list[list[Prompt]], instances: int) -> list[list[int]]:
    """Deal prompts to instances in turn; the turn carries over from one step to the next."""
    queues: list[list[int]] = [[] for _ in range(instances)]
    turn = 0
    for order in orders:
        for p in order:
            queues[turn % instances].append(p.pid)
            turn += 1
    return queues


def verl_policy(workload: Workload, instances: int, mb: int, **_) -> Schedule:
    """VeRL's split: each step's prompts in dataloader order, cut into equal contiguous shares, one per instance."""
    queues: list[list[int]] = [[] for _ in range(instances)]
    for step in workload:
        for queue, share in zip(queues, even_shares(step, instances)):
            queue.extend(p.pid for p in share)
    return Schedule("verl", queues, [_groups(step, mb) for step in workload])


def _mean_pred(p: Prompt) -> float:
    return sum(p.predicted) / len(p.predicted)


def fifo(workload: Workload, instances: int, mb: int, **_) -> Schedule:
    """Dataloader order, prompts dealt round-robin to instances, minibatches of consecutive prompts."""
    return Schedule("fifo", _round_robin(workload, instances), [_groups(step, mb) for step in workload])


def random_policy(workload: Workload, instances: int, mb: int, seed: int = 0, **_) -> Schedule:
    """A seeded shuffle of each step, then as fifo."""
    rng = random.Random(f"random-policy:{seed}")
    orders = []
    for step in workload:
        order = list(step)
        rng.shuffle(order)
        orders.append(order)
    return Schedule("random", _round_robin(orders, instances), [_groups(o, mb) for o in orders])


def sorted_policy(workload: Workload, instances: int, mb: int, **_) -> Schedule:
    """SortedRL-like: shortest predicted first, round-robin, minibatches cut from the sorted order."""
    orders = [sorted(step, key=_mean_pred) for step in workload]  # stable: ties keep dataloader order
    return Schedule("sorted", _round_robin(orders, instances), [_groups(o, mb) for o in orders])


def longest_first(workload: Workload, instances: int, mb: int, hint: CostHint = CostHint(), **_) -> Schedule:
    """Balancing only: LPT on predicted cost, longest first in every queue; fifo minibatches."""
    loads = [0.0] * instances
    queues: list[list[int]] = [[] for _ in range(instances)]
    for step in workload:
        for i, placed in enumerate(lpt(step, loads, hint)):
            queues[i].extend(p.pid for p in placed)
    return Schedule("longest_first", queues, [_groups(step, mb) for step in workload])


SCHEDULERS = {
    "verl": verl_policy,
    "fifo": fifo,
    "random": random_policy,
    "sorted": sorted_policy,
    "longest_first": longest_first,
}


def build(
    policy: str,
    workload: Workload,
    instances: int,
    mb: int,
    *,
    hint: CostHint = CostHint(),
    seed: int = 0,
    trainer=None,
) -> Schedule:
    """The schedule of ``policy`` (one of POLICIES) for ``workload`` on ``instances`` instances.

    ``trainer`` (trainer.TrainerModel) lets asp lay minibatches out for the trainer's data-parallel ranks.
    """
    if policy in ("asp", "oracle"):
        data = with_predictions(workload, exact=policy == "oracle")
        sched = asp_schedule(data, instances, mb, hint=hint, trainer=trainer)
        sched.policy = policy
        return sched
    if policy not in SCHEDULERS:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    return SCHEDULERS[policy](workload, instances, mb, hint=hint, seed=seed)
