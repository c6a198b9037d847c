"""RUN_DIR/rl/rollouts.jsonl: one JSON object per sample (runs/paths.py names its fields), as text and token ids,
with its instance, the policy version that generated it and its reward; a step whose reward failed writes one
{"step", "error"} line. The leads' records are gathered to global rank 0, which appends them in sample order."""

from __future__ import annotations

import json
import os

import torch.distributed as dist

from specdraft.runs import files as runfiles
from specdraft.runs.paths import RL, ROLLOUTS


class RolloutLog:
    def __init__(self, ctx):
        self.ctx = ctx
        self.rank0 = ctx.global_rank == 0
        if self.rank0:
            runfiles.make_dir(ctx.run_dir, RL)

    def write(self, batch) -> None:
        """Every rank (a collective): the step's samples, each lead sending its own."""
        mine = [self._record(batch, g, instance) for g, instance in self._own(batch)]
        gathered: list | None = [None] * dist.get_world_size() if self.rank0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank0 and gathered is not None:
            records = sorted((r for part in gathered for r in part), key=lambda r: r["sample"])
            self._append(records)

    def error(self, step: int, message: str) -> None:
        if self.rank0:
            self._append([{"step": step, "error": message}])

    def _own(self, batch):
        instance_of = batch.dispatch.instance_of()
        for g in batch.generated:
            yield g, instance_of[g.sample // batch.num_generations]

    @staticmethod
    def _record(batch, g, instance: int) -> dict:
        prompt = batch.prompt_of(g.sample)
        return {
            "step": batch.step,
            "sample": g.sample,
            "instance": instance,
            "policy_version": batch.policy_version,
            "prompt_index": prompt.index,
            "prompt_text": prompt.text,
            "response_text": batch.texts.get(g.sample, ""),
            "answer": prompt.answer,
            "reward": g.reward,
            "prompt_ids": list(prompt.tokens),
            "response_ids": list(g.ids),
            "finished": g.finished,
            **({"row": prompt.info["row"]} if "row" in prompt.info else {}),
        }

    def _append(self, records: list[dict]) -> None:
        fd = runfiles.open_append(self.ctx.run_dir, ROLLOUTS)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(r) + "\n" for r in records))
