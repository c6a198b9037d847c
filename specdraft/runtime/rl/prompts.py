"""The prompt stream of a GRPO run: step s takes prompts [s * P, (s + 1) * P) of the task's seeded sequence, so
its position is a pure function of the step, and the step a checkpoint records restores it (as for the Markov
chain's rows: data.MarkovData)."""

from __future__ import annotations

from specdraft.runtime.rl.tasks import Prompt


class PromptStream:
    def __init__(self, task, *, seed: int, num_per_step: int):
        self.task, self.seed, self.num_per_step = task, seed, num_per_step

    def step_prompts(self, step: int) -> list[Prompt]:
        first = step * self.num_per_step
        return [self.task.prompt(self.seed, first + i) for i in range(self.num_per_step)]

    def next_prompt(self, step: int) -> int:
        """The stream position before ``step``: the index of its first prompt."""
        return step * self.num_per_step

    # The data interface of train/data.MarkovData: no position beyond the step itself.
    def position(self, step: int) -> None:
        return None

    def restore(self, step: int, saved: dict | None) -> None:
        return None

    def summary(self) -> dict:
        return {"task": self.task.name}
