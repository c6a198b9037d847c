"""Offline rollout schedules: which instance runs each sample, in what order, and how minibatches are grouped.

Policies: fifo, random, sorted (SortedRL-like), longest_first (balancing only), asp (the length-aware scheduler
of docs/rollout.md) and oracle (asp fed the true lengths). Every policy keeps the n samples of a prompt together:
on one instance, consecutive in its queue, and in one training minibatch (GRPO needs the whole group for its
advantage). No policy moves a prompt to another RL step: the dataloader's step membership is never changed.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from specdraft.rollout.workload import Prompt, Workload

POLICIES = ("fifo", "random", "sorted", "longest_first", "asp", "oracle")


@dataclass
class Schedule:
    """queues[i]: prompt ids in instance i's admission order; each stands for all its samples, consecutive.

    minibatches[step][j]: the (prompt id, sample) pairs of minibatch j of an RL step, in the order the trainer
    lays them out (Megatron hands contiguous shares of that order to its data-parallel ranks).
    """

    policy: str
    queues: list[list[int]]
    minibatches: list[list[list[tuple[int, int]]]]


@dataclass(frozen=True)
class CostHint:
    """Predicted GPU-seconds of a sample of length L after a prompt of P tokens: L * (alpha + beta * (P + L/2)).

    alpha is the weight-side share of a decode step per generated token at a typical batch, beta the KV read per
    context token per generated token (from the cost model); see `hint_from_cost`. ``token_s`` is the wall time
    one sequence needs per generated token in such a batch (its step time over the tokens a step yields).
    """

    alpha: float = 1.0
    beta: float = 0.0
    token_s: float = 1.0

    def sample(self, length: float, prompt_len: int) -> float:
        return length * (self.alpha + self.beta * (prompt_len + length / 2.0))

    def prompt(self, p: Prompt) -> float:
        a, b, base = self.alpha, self.beta, p.prompt_len
        return sum(x * (a + b * (base + x / 2.0)) for x in p.predicted)


def hint_from_cost(cost, tp: int, batch: int) -> CostHint:
    """The cost model's affine step cost, per generated token, at a typical running batch."""
    batch = max(1, batch)
    spec = cost.use_speculation(tp, batch, batch * 4096.0)
    a, b = cost.affine(tp, batch, spec, batch * 4096.0)
    e = cost.tokens_per_step(spec)
    return CostHint(alpha=a / batch / e, beta=b / e, token_s=(a + b * batch * 4096.0) / e)


def minibatch_prompts(global_batch_size: int, n: int) -> int:
    """Prompts per training minibatch: global_batch_size samples of whole groups (at least one prompt)."""
    return max(1, global_batch_size // max(n, 1))


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _expand(order: list[Prompt]) -> list[tuple[int, int]]:
    return [(p.pid, s) for p in order for s in range(len(p.lengths))]


def _groups(order: list[Prompt], mb: int) -> list[list[tuple[int, int]]]:
    """Minibatches of ``mb`` consecutive prompts, each prompt's samples contiguous."""
    return [_expand(c) for c in _chunks(order, mb)]


def _round_robin(orders: list[list[Prompt]], instances: int) -> list[list[int]]:
    """Deal prompts to instances in turn; the turn carries over from one step to the next."""
    queues: list[list[int]] = [[] for _ in range(instances)]
    turn = 0
    for order in orders:
        for p in order:
            queues[turn % instances].append(p.pid)
            turn += 1
    return queues


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


def _lpt(step: list[Prompt], loads: list[float], hint: CostHint) -> list[list[Prompt]]:
    """Longest-processing-time first: each prompt (by predicted cost, descending) to the least-loaded instance."""
    heap = [(load, i) for i, load in enumerate(loads)]
    heapq.heapify(heap)
    placed: list[list[Prompt]] = [[] for _ in loads]
    costs = {p.pid: hint.prompt(p) for p in step}
    for p in sorted(step, key=lambda q: -costs[q.pid]):  # stable: ties keep dataloader order
        load, i = heapq.heappop(heap)
        placed[i].append(p)
        load += costs[p.pid]
        loads[i] = load
        heapq.heappush(heap, (load, i))
    return placed


def longest_first(workload: Workload, instances: int, mb: int, hint: CostHint = CostHint(), **_) -> Schedule:
    """Balancing only: LPT on predicted cost, longest first in every queue; fifo minibatches."""
    loads = [0.0] * instances
    queues: list[list[int]] = [[] for _ in range(instances)]
    for step in workload:
        for i, placed in enumerate(_lpt(step, loads, hint)):
            queues[i].extend(p.pid for p in placed)
    return Schedule("longest_first", queues, [_groups(step, mb) for step in workload])


SCHEDULERS = {
    "fifo": fifo,
    "random": random_policy,
    "sorted": sorted_policy,
    "longest_first": longest_first,
}


def build(policy: str, workload: Workload, instances: int, mb: int, *, hint: CostHint = CostHint(), seed: int = 0,
          trainer=None) -> Schedule:
    """The schedule of ``policy`` (one of POLICIES) for ``workload`` on ``instances`` instances.

    ``trainer`` (trainer.TrainerModel) lets asp lay minibatches out for the trainer's data-parallel ranks.
    """
    from specdraft.rollout.asp import asp_schedule
    from specdraft.rollout.workload import with_predictions

    if policy in ("asp", "oracle"):
        data = with_predictions(workload, exact=policy == "oracle")
        sched = asp_schedule(data, instances, mb, hint=hint, trainer=trainer)
        sched.policy = policy
        return sched
    if policy not in SCHEDULERS:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    return SCHEDULERS[policy](workload, instances, mb, hint=hint, seed=seed)
