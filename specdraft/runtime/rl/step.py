"""The step batch one GRPO step hands from phase to phase (generate -> score -> exchange -> log-probs -> advantages ->
update -> refit), and the timer that names each phase's seconds (verl's `fit()` step is the model)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from specdraft.runtime.rl.dispatch import Dispatch
from specdraft.runtime.rl.exchange import Generated
from specdraft.runtime.rl.prompts import Prompt


@dataclass
class StepBatch:
    """One step's samples. Sample s is prompt s // G's generation s % G. Every rank holds the step's prompts, its
    dispatch and every sample's length, reward, finish and advantage (a few numbers each); the response tokens only
    of the samples it trains, and an instance lead also what its engine generated (with the text it scored)."""

    step: int
    policy_version: int  # the policy updates the generating weights had seen
    prompts: list[Prompt]
    num_generations: int
    dispatch: Dispatch
    generated: list[Generated] = field(default_factory=list)  # a lead's own samples
    texts: dict[int, str] = field(default_factory=dict)  # a lead's own samples' response text
    lengths: torch.Tensor | None = None  # (S,) int64
    rewards: torch.Tensor | None = None  # (S,) float64
    finished: torch.Tensor | None = None  # (S,) bool
    advantages: torch.Tensor | None = None  # (S,) float64
    responses: dict[int, tuple[int, ...]] = field(default_factory=dict)  # the samples this rank trains
    instances: list[dict] = field(default_factory=list)  # per instance: what it generated and how long it took
    old_logp: dict[int, torch.Tensor] = field(default_factory=dict)  # per local microbatch (last stage)
    ref_logp: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return len(self.prompts) * self.num_generations

    def prompt_of(self, sample: int) -> Prompt:
        return self.prompts[sample // self.num_generations]


class Phases:
    """Wall seconds per named phase of one step, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
