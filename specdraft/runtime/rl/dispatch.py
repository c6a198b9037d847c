"""Which rollout instance generates each prompt group of a step, and in what order: the offline schedules of
specdraft/rollout/schedule (the simulator's own code) over the step's prompts. `fifo` deals the stream's prompts
round-robin; `asp` places them longest-predicted first on the least-loaded instance, from each prompt's measured
response lengths in earlier epochs. Every rank computes the same dispatch from the same state (the predictor is
updated with every step's measured lengths on every rank and saved in checkpoints), so no rank has to send it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.rollout.model.workload import Prompt as Planned
from specdraft.rollout.schedule.asp import asp_schedule
from specdraft.rollout.schedule.dispatch import CostHint, minibatch_prompts
from specdraft.rollout.schedule.scheduler import fifo


@dataclass(frozen=True)
class Dispatch:
    """queues[i]: the step's prompt positions (0..P-1) instance i generates, in its admission order."""

    policy: str
    queues: tuple[tuple[int, ...], ...]
    predicted: tuple[float, ...]  # per prompt: the predicted length of each of its samples

    def instance_of(self) -> list[int]:
        """Per prompt position: its instance."""
        out = [0] * sum(len(q) for q in self.queues)
        for i, queue in enumerate(self.queues):
            for position in queue:
                out[position] = i
        return out


class LengthPredictor:
    """Each prompt's predicted response length: the mean of its samples' measured lengths in earlier epochs (by the
    prompt's key, its source row). A prompt never measured is predicted at the mean of every length measured so
    far in the run, and before the first step at half of rollout.max_response_length: the documented prior."""

    def __init__(self, max_new_tokens: int):
        self.prior = max_new_tokens / 2.0
        self.sums: dict[int, list[float]] = {}  # key -> [sum, count]
        self.total = [0.0, 0.0]

    def predict(self, key: int) -> float:
        seen = self.sums.get(key)
        if seen:
            return seen[0] / seen[1]
        return self.total[0] / self.total[1] if self.total[1] else self.prior

    def observe(self, keys: list[int], lengths: list[list[int]]) -> None:
        for key, group in zip(keys, lengths):
            entry = self.sums.setdefault(key, [0.0, 0.0])
            entry[0] += sum(group)
            entry[1] += len(group)
            self.total[0] += sum(group)
            self.total[1] += len(group)

    def state(self) -> dict:
        return {"keys": sorted(self.sums), "sums": [self.sums[k] for k in sorted(self.sums)], "total": self.total}

    def load(self, state: dict) -> None:
        self.sums = {int(k): [float(a), float(b)] for k, (a, b) in zip(state["keys"], state["sums"])}
        self.total = [float(x) for x in state["total"]]


def dispatch(policy: str, prompts, predictor: LengthPredictor, *, num_instances: int, num_generations: int,
             global_batch_size: int, first_position: int) -> Dispatch:  # fmt: skip
    """The step's dispatch. ``first_position``: the stream position of the step's first prompt (fifo's turn carries
    over from step to step, as in the simulator)."""
    predicted = [predictor.predict(p.key) for p in prompts]
    planned = [
        Planned(pid=i, step=0, prompt_len=len(p.tokens), lengths=[0] * num_generations, predicted=[x] * num_generations)
        for i, (p, x) in enumerate(zip(prompts, predicted))
    ]
    mb = minibatch_prompts(global_batch_size, num_generations)
    if policy == "asp":
        # samples weigh by predicted tokens: the decode steps they hold an instance for
        queues = asp_schedule([planned], num_instances, mb, hint=CostHint()).queues
    elif policy == "fifo":
        turn = first_position % num_instances
        queues = fifo([planned], num_instances, mb).queues
        queues = queues[-turn:] + queues[:-turn] if turn else queues  # the stream's k-th prompt goes to k % n
    else:
        raise ValueError(f"rollout.schedule {policy!r}: expected fifo or asp")
    return Dispatch(policy, tuple(tuple(q) for q in queues), tuple(predicted))
