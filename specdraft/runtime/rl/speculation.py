"""rollout.adaptive_k in the running job: each instance's k-by-batch schedule (rollout/model/kchoice.py), re-derived
after every step from the per-position acceptance its engine measured. The exchange gives every rank every
instance's counters, so every rank holds the same schedules; each lead hands its own to its engine."""

from __future__ import annotations

from typing import Optional

from specdraft.rollout.model.kchoice import KSchedule, k_schedule


class KControl:
    """The instances' schedules: the plan's (from the cost model) until an instance has drafted, then its own."""

    def __init__(self, plan, num_instances: int):
        self.adaptive = plan.rollout.adaptive_k if plan.rollout is not None else None
        start: Optional[KSchedule] = self.adaptive.schedule if self.adaptive else None
        self.schedules: list[Optional[KSchedule]] = [start] * num_instances
        self.max_batch = plan.rollout_settings.max_num_seqs
        # vLLM captures CUDA graphs for the k values of the schedule it starts with: on CUDA a later schedule keeps
        # to those (and 0); CPU engines run eager and may take any k up to max_k
        self.allowed: Optional[frozenset] = None
        if self.adaptive and plan.cluster.gpu != "cpu":
            self.allowed = frozenset(k for _, _, k in self.adaptive.schedule) | {0}

    def apply(self, engine, instance: int) -> None:
        """A lead, before it generates: its engine drafts by its instance's current schedule."""
        schedule = self.schedules[instance]
        if schedule is not None:
            engine.set_k_schedule(schedule)

    def observe(self, instances: list[dict]) -> None:
        """Every rank, after the exchange: record the schedule each instance ran with (metrics.jsonl), then derive
        the next from what it measured. An instance that drafted nothing keeps its schedule: nothing was measured."""
        if self.adaptive is None:
            return
        for i, entry in enumerate(instances):
            entry["k_schedule"] = [list(r) for r in self.schedules[i] or ()]
            drafts = entry["drafts"]
            if drafts <= 0:
                continue
            acceptance = [a / drafts for a in entry["accepted_per_pos"]]
            self.schedules[i] = k_schedule(
                acceptance, self.adaptive.costs, self.adaptive.max_k, self.max_batch, self.allowed
            )
