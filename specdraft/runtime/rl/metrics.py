"""Per-step GRPO metrics: cotrain's record (draft loss, training-time acceptance, grad norms) plus the rewards, the
clipped loss's terms, the engines' measured acceptance (over every instance, and per instance), and where the step's
seconds went, phase by phase (docs/grpo.md, "Metrics")."""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.runtime.train.metrics import StepMetrics


def engine_figures(instances: list[dict]) -> dict:
    """The engines' figures over every instance: acceptance counted over all their verify steps."""
    drafts = sum(i["drafts"] for i in instances)
    accepted = sum(i["accepted"] for i in instances)
    per_pos = [sum(col) for col in zip(*(i["accepted_per_pos"] for i in instances))]
    generated = sum(i["generated_tokens"] for i in instances)
    forwards = sum(i["target_forwards"] for i in instances)
    return {
        "accept_length": 1.0 + accepted / drafts if drafts else 1.0,
        "acceptance_per_pos": [a / drafts if drafts else 0.0 for a in per_pos],
        "num_generated_tokens": int(generated),
        "num_target_forwards": int(forwards),
        "tokens_per_target_forward": generated / forwards if forwards else 0.0,
    }


def instance_rows(instances: list[dict], refit: dict[int, float]) -> list[dict]:
    """metrics.jsonl's per-instance figures (CONTRACTS: samples, generated tokens, busy and idle seconds, accept
    length, refit seconds)."""
    rows = []
    for i in instances:
        rows.append(
            {
                "instance": i["instance"],
                "samples": int(i["samples"]),
                "generated_tokens": int(i["generated_tokens"]),
                "busy_s": round(i["busy_s"], 6),
                "idle_s": round(i["idle_s"], 6),
                "accept_length": round(1.0 + i["accepted"] / i["drafts"], 6) if i["drafts"] else 1.0,
                "refit_s": round(refit.get(i["instance"], 0.0), 6),
            }
        )
        if "k_schedule" in i:  # rollout.adaptive_k: the (first batch, last batch, k) ranges this step drafted by
            rows[-1]["k_schedule"] = i["k_schedule"]
    return rows


class GrpoMetrics(StepMetrics):
    def grpo_record(self, step: int, phase: str, seconds: dict, batch) -> dict:
        """Every rank: the step's record; rank 0 writes it. ``batch`` (step.StepBatch) is None in an SFT step."""
        t = self.trainer
        policy_refit = seconds.pop("policy_refit", {})
        draft_refit = seconds.pop("draft_refit", {})
        decision = seconds.pop("draft_refit_decision", None)  # draft.refit_policy drift: refit or not, and why
        step_s = sum(seconds.values())
        record = self.measure(step, step_s)
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
        record.update({f"{k}_s": round(v, 6) for k, v in seconds.items()})
        # the trainer's share of the step: its log-prob passes and the update
        record["train_s"] = round(seconds.get("logprobs", 0.0) + seconds.get("update", 0.0), 6)
        if policy_refit:
            record["policy_refit_s"] = round(max(policy_refit.values()), 6)
        if draft_refit:
            record["draft_refit_s"] = round(max(draft_refit.values()), 6)
        if decision is not None:
            record["draft_refit"] = decision
        if batch is not None:
            lengths = batch.lengths.double()
            engine = engine_figures(batch.instances)
            refits = {i: policy_refit.get(i, 0.0) + draft_refit.get(i, 0.0) for i in range(len(batch.instances))}
            record.update(
                policy_version=batch.policy_version,
                reward_mean=float(batch.rewards.mean()),
                reward_std=float(batch.rewards.std(unbiased=False)),
                response_length=float(lengths.mean()),
                finished_fraction=float(batch.finished.double().mean()),
                next_prompt=batch.prompts[-1].index + 1,
                engine=engine,
                instances=instance_rows(batch.instances, refits),
                schedule=batch.dispatch.policy,
            )
            generate = seconds.get("generate", 0.0)
            if generate > 0:
                record["tokens_per_s"] = round(engine["num_generated_tokens"] / generate, 3)
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
        f"gen {r['generate_s']:.2f}s refit {r['refit_s']:.2f}s update {r['update_s']:.2f}s "
        f"{r.get('tokens_per_s', 0.0):.0f} tok/s x{len(r['instances'])}"
    )
