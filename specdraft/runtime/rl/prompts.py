"""The prompt stream of a GRPO run: step s takes prompts [s * P, (s + 1) * P) of the task's seeded sequence, so
its position is a pure function of the step; a checkpoint records it and a resume checks it."""

from __future__ import annotations

from specdraft.runtime.rl.tasks import Prompt


class PromptStream:
    def __init__(self, task, *, seed: int, num_per_step: int):
        self.task, self.seed, self.num_per_step = task, seed, num_per_step

    def step_prompts(self, step: int) -> list[Prompt]:
        first = step * self.num_per_step
        return [self.task.prompt(self.seed, first + i) for i in range(self.num_per_step)]

    # The data position a checkpoint saves (the interface of train/data.MarkovData and train/packing.PackedData).
    def position(self, step: int) -> dict:
        return {"task": self.task.name, "next_prompt": step * self.num_per_step}

    def restore(self, step: int, saved: dict | None) -> str | None:
        want = self.position(step)
        if saved is not None and saved != want:
            raise ValueError(f"the checkpoint's prompt position {saved} is not this run's {want} at step {step}")
        return None

    def summary(self) -> dict:
        return {"task": self.task.name}
