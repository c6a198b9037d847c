"""What every offline rollout schedule shares: the Schedule record, the per-sample cost hint, LPT dispatch.

The policies (scheduler.py) and the asp scheduler (asp.py) both build on this module, and the generation
simulation dispatches with the same longest-processing-time rule; nothing here imports either of them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from specdraft.rollout.model.workload import Prompt


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
    speculating = cost.use_speculation(tp, batch, batch * 4096.0)
    a, b = cost.affine(tp, batch, speculating, batch * 4096.0)
    e = cost.tokens_per_step(speculating)
    return CostHint(alpha=a / batch / e, beta=b / e, token_s=(a + b * batch * 4096.0) / e)


def minibatch_prompts(global_batch_size: int, n: int) -> int:
    """Prompts per training minibatch: global_batch_size samples of whole groups (at least one prompt)."""
    return max(1, global_batch_size // max(n, 1))


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def even_shares(items: list, k: int) -> list[list]:
    """``items`` cut into k contiguous shares whose sizes differ by at most one (the first ones larger)."""
    base, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        size = base + (i < extra)
        out.append(items[start : start + size])
        start += size
    return out


def lpt(step: list[Prompt], loads: list[float], hint: CostHint) -> list[list[Prompt]]:
    """Longest-processing-time first: each prompt (by predicted cost, descending) to the least-loaded instance.

    ``loads`` (one per instance) are updated in place, so a caller can carry them from one step to the next.
    """
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
