"""Per-step GRPO metrics: cotrain's record (draft loss, training-time acceptance, grad norms) plus the rewards,
the clipped loss's terms, the rollout engine's measured acceptance and where the step's seconds went
(docs/grpo.md, "Metrics")."""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.runtime.train.metrics import StepMetrics


class GrpoMetrics(StepMetrics):
    def grpo_record(self, step: int, phase: str, seconds: dict, rollout: dict | None) -> dict:
        """Every rank: the step's record; rank 0 writes it. ``rollout`` holds rank 0's rewards and engine figures
        (broadcast to all ranks), None in an SFT step."""
        t = self.trainer
        record = self.measure(step, seconds["step"])
        sums = torch.tensor(
            [float(t.stats[k]) for k in ("pg", "ref_kl", "clipped")], dtype=torch.float64, device=t.device
        )
        dist.all_reduce(sums)
        n = max(t.n_target, 1.0)
        pg, kl, clipped = (float(x) / n for x in sums.cpu())
        record["phase"] = phase
        if phase == "sft":
            record.update(policy_loss=None, kl=None, clip_fraction=None)
        else:
            record["target_loss"] = None  # no next-token loss in an RL step
            record.update(policy_loss=pg, kl=kl, clip_fraction=clipped)
            record["loss"] = pg + t.settings.kl_penalty * kl
        if rollout is not None:
            record.update(rollout)
        record.update({f"{k}_s": round(v, 6) for k, v in seconds.items() if k != "step"})
        generate = seconds.get("generate", 0.0)
        if rollout is not None and generate > 0:
            record["tokens_per_s"] = round(rollout["engine"]["num_generated_tokens"] / generate, 3)
        self.write(record, _line(step, self.ctx.steps, record))
        return record


def _line(step: int, steps: int, r: dict) -> str:
    head = f"step {step + 1}/{steps} {r['phase']}"
    if r["phase"] == "sft":
        return f"{head} target_loss {r['target_loss']:.4f} draft_loss {r['draft_loss']} {r['step_time_s']:.2f}s"
    e = r["engine"]
    return (
        f"{head} reward {r['reward_mean']:.3f}±{r['reward_std']:.3f} len {r['response_length']:.1f} "
        f"loss {r['policy_loss']:.4f} kl {r['kl']:.4f} clip {r['clip_fraction']:.3f} draft_loss {r['draft_loss']} "
        f"engine accept_len {e['accept_length']:.2f} [{' '.join(f'{a:.2f}' for a in e['acceptance_per_pos'])}] "
        f"gen {r['generate_s']:.2f}s refit {r['refit_s']:.2f}s train {r['train_s']:.2f}s "
        f"{r.get('tokens_per_s', 0.0):.0f} tok/s"
    )
