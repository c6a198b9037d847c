"""Per-step co-training metrics: one world all-reduce of what each rank measured, appended to metrics.jsonl.

`acceptance[j]` is the fraction of valid positions where the draft's top-1 at TTT step j equals the target's
top-1; `accept_len` is the mean number of tokens one verify step would accept: 1 (the target's own token) plus
the run of leading TTT steps whose top-1 matched, averaged over positions (see draft.accept_length).
`moe_aux_loss` (MoE targets with model.moe_aux_loss_coeff > 0) is megatron's load-balancing loss without its
coefficient, per MoE layer and microbatch: 1.0 when the router spreads tokens evenly. `grad_norm` and
`draft_grad_norm` are the global gradient norms before clipping, `loss_scale` the fp16 loss scale the step's
backward used (null otherwise), `skipped_step` true when an inf/NaN gradient skipped the optimizer step (fp16).
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from specdraft.runs import files as runfiles
from specdraft.runs.paths import METRICS
from specdraft.runtime.context import RankContext
from specdraft.runtime.models import moe


class StepMetrics:
    def __init__(self, ctx: RankContext, trainer):
        self.ctx, self.trainer = ctx, trainer
        self.last: dict = {}
        if ctx.global_rank == 0:
            ctx.metrics_path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, step: int, step_time: float) -> dict:
        record = self.measure(step, step_time)
        accept = " ".join(f"{a:.2f}" for a in record["acceptance"])
        draft_loss = record["draft_loss"] if record["draft_loss"] is None else round(record["draft_loss"], 4)
        self.write(
            record,
            f"step {step + 1}/{self.ctx.steps} target_loss {record['target_loss']:.4f} draft_loss {draft_loss} "
            f"acceptance [{accept}] accept_len {record['accept_len']} {record['step_time_s']:.2f}s",
        )
        return record

    def measure(self, step: int, step_time: float) -> dict:
        """The step's record, reduced over the world (every rank calls it)."""
        t = self.trainer
        s, steps = t.stats, t.steps_ttt
        # On the trainer's device: NCCL reduces only device tensors.
        # The step's sums are device scalars (or 0.0 where nothing was added): one stack, one all-reduce.
        vector = torch.stack(
            [
                torch.as_tensor(x, dtype=torch.float64, device=t.device).reshape(())
                for x in (
                    s["target_sum"],
                    *s["kl"],
                    *s["match"],
                    s["accepted"],
                    s["positions"],
                    float(t.channel.bytes_sent),
                    moe.take_aux_loss(),
                )
            ]
        )
        dist.all_reduce(vector)
        times = torch.tensor([step_time, t.draft_timer.seconds()], dtype=torch.float64, device=t.device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t.channel.bytes_sent = t.channel.bytes_received = 0
        vector, times = vector.cpu(), times.cpu()
        kl, match = vector[1 : 1 + steps], vector[1 + steps : 1 + 2 * steps]
        accepted, positions, tap_bytes, aux = vector[1 + 2 * steps :].tolist()
        n = torch.tensor(t.n_draft, dtype=torch.float64).clamp(min=1)
        record = {
            "step": step,
            "target_loss": float(vector[0]) / max(t.n_target, 1.0),
            "draft_loss": float((kl / n).mean()) if t.cotraining else None,
            "acceptance": [round(float(x), 6) for x in match / n] if t.cotraining else [],
            "accept_len": round(accepted / positions, 6) if positions else None,
            "tap_bytes": int(tap_bytes),
            "moe_aux_loss": self._per_layer_and_microbatch(aux),
            "step_time_s": round(float(times[0]), 6),
            "draft_time_s": round(float(times[1]), 6),
            "attention": t.attention,
            **self._optimizer_fields(),
        }
        position = t.data.position(step + 1)  # a data file's next sample after this step; None for the Markov chain
        if position is not None:
            record["data"] = position
        return record

    def write(self, record: dict, line: str) -> None:
        """Rank 0: append ``record`` to metrics.jsonl and print ``line``."""
        self.last = record
        if self.ctx.global_rank == 0:
            # No link followed: a metrics.jsonl planted as a link must not send the rows out of the run folder.
            with os.fdopen(runfiles.open_append(self.ctx.run_dir, METRICS), "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            print(line, flush=True)

    def _optimizer_fields(self) -> dict:
        """The optimizer step's report (precision.optimizer_steps), the same on every rank."""
        t, report = self.trainer, self.trainer.step_report
        return {
            "grad_norm": report.get("grad_norm"),
            "draft_grad_norm": report.get("draft_grad_norm"),
            "loss_scale": report.get("loss_scale"),
            "skipped_step": report.get("skipped", False),
            "precision": t.precision.describe(t.optimizer.sharded_over),
        }

    def _per_layer_and_microbatch(self, aux_sum: float) -> float | None:
        plan = self.ctx.plan
        if not plan.model.num_experts or not plan.model.moe_aux_loss_coeff:
            return None
        microbatches = plan.num_microbatches * plan.parallel.dp
        return aux_sum / (microbatches * plan.model.num_layers)
