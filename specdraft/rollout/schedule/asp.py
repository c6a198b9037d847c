"""The ASP-style offline rollout scheduler: one pass that balances instances, shapes minibatches, orders arrivals.

Per RL step (the dataloader's step membership is never changed), from predicted lengths only:
  1. balance (skewness bubbles): LPT of prompt groups on predicted GPU-seconds, instance loads carried across
     steps; each queue runs its groups longest first, so the samples that bound the step start at once;
  2. minibatches (sorting bubbles): length-homogeneous by predicted longest sample, so minibatches complete
     one after another, shortest first, while the long samples (started first) run on;
  3. layout (padding bubbles): inside a minibatch, samples are ordered so Megatron's contiguous data-parallel
     shares carry equal predicted work.
The lag bound is kept by construction: every queue holds step t before step t+1, and the controller releases a
step only while the bound allows it (simulator.py enforces and records it).
"""

from __future__ import annotations

from specdraft.rollout.model.workload import Prompt, Workload
from specdraft.rollout.schedule.dispatch import CostHint, Schedule, chunks, lpt


def dp_layout(group: list[Prompt], trainer) -> list[tuple[int, int]]:
    """A minibatch's samples ordered so each contiguous data-parallel share carries about the same predicted work.

    Megatron splits a minibatch over DP ranks by count, in order. Samples sorted by predicted FLOPs are dealt to
    the ranks in a snake (0, 1, .., dp-1, dp-1, .., 0, 0, 1, ..): equal counts, and shares that differ by at most
    one sample's work. The ranks' shares are then concatenated.
    """
    samples = [(p.pid, s) for p in group for s in range(len(p.predicted))]
    dp = trainer.dp if trainer is not None else 1
    if dp <= 1 or len(samples) <= 1:
        return samples
    per_token, quad = trainer.flops_per_token, trainer.attn_flops_coef
    work = [(p.prompt_len + x) * (per_token + quad * (p.prompt_len + x)) for p in group for x in p.predicted]
    bins: list[list[tuple[int, int]]] = [[] for _ in range(dp)]
    period = 2 * dp
    for i, idx in enumerate(sorted(range(len(samples)), key=work.__getitem__, reverse=True)):
        r = i % period
        bins[r if r < dp else period - 1 - r].append(samples[idx])
    return [k for b in bins for k in b]


def minibatches(step: list[Prompt], mb: int) -> list[list[Prompt]]:
    """Length-homogeneous minibatches: prompts by predicted longest sample, longest first, cut every mb prompts.

    A minibatch can be trained only once its longest sample is done, so grouping by the longest sample lets the
    short minibatches reach the trainer early and one after another instead of all waiting for the tail.
    """
    return chunks(sorted(step, key=lambda p: -max(p.predicted)), mb)  # stable: ties keep dataloader order


def asp_schedule(workload: Workload, instances: int, mb: int, *, hint: CostHint, trainer=None) -> Schedule:
    """The asp schedule of ``workload`` (predicted lengths only) on ``instances`` instances."""
    loads = [0.0] * instances
    queues: list[list[int]] = [[] for _ in range(instances)]
    batches = []
    for step in workload:
        for i, placed in enumerate(lpt(step, loads, hint)):
            queues[i].extend(p.pid for p in placed)
        batches.append([dp_layout(g, trainer) for g in minibatches(step, mb)])
    return Schedule("asp", queues, batches)
