"""One rollout engine per plan.rollout instance, on the instance's lead (its first training rank), and their refits.
(Interim: the policy is gathered to each lead in turn; the bucketed refit groups replace it.)"""

from __future__ import annotations

from pathlib import Path

import torch

from specdraft.runtime.rl import refit


class Instances:
    def __init__(self, ctx, trainer, *, eos_id, resumed_engine_draft=None):
        from specdraft.runtime.rl.engine import open_engine

        self.ctx, self.trainer, self.plan = ctx, trainer, ctx.plan
        rollout = self.plan.rollout
        self.leads = [inst.training_ranks[0] for inst in rollout.instances]
        self.instance_of_this_rank = self.leads.index(ctx.global_rank) if ctx.global_rank in self.leads else None
        self.gathers = [refit.Gather(trainer, dst=lead) for lead in self.leads]
        self.engine = None
        self.engine_draft: dict | None = None  # on leads: the draft state the engine holds
        policy = None
        for gather in self.gathers:
            got = gather.policy()
            policy = got if got is not None else policy
        draft = None
        if self.plan.draft.enabled:
            for gather in self.gathers:
                got = gather.draft()
                draft = got if got is not None else draft
        if self.instance_of_this_rank is None or policy is None:
            return
        if draft is not None and resumed_engine_draft is not None:
            draft = {**draft, **resumed_engine_draft}
        self.engine_draft = draft
        folder = ctx.run_dir / "rl" / f"instance-{self.instance_of_this_rank}"
        folder.mkdir(parents=True, exist_ok=True)
        policy_dir = refit.write_policy(folder / "policy", self.plan, policy, 0)
        draft_dir = refit.write_draft(folder / "draft", self.plan, draft, 0) if draft is not None else None
        rs = self.plan.rollout_settings
        self.engine = open_engine(
            self.plan.grpo.engine,
            policy_dir=policy_dir,
            draft_dir=draft_dir if (draft_dir is not None and rs.speculative) else None,
            k=rs.num_speculative_tokens,
            eos_id=eos_id,
            device=ctx.device,
            seed=self.plan.training.seed,
        )

    def refit_policy(self) -> dict[int, float]:
        out = {}
        for i, gather in enumerate(self.gathers):
            policy = gather.policy()
            if policy is not None and self.engine is not None:
                out[i] = self.engine.refit_policy(policy.items())
        return _everyone(out, len(self.leads), self.trainer.device)

    def refit_draft(self) -> dict[int, float]:
        out = {}
        for i, gather in enumerate(self.gathers):
            draft = gather.draft()
            if draft is not None and self.engine is not None and self.plan.rollout_settings.speculative:
                out[i] = self.engine.refit_draft(refit.eagle3_tensors(self.trainer, draft).items())
                self.engine_draft = draft
        return _everyone(out, len(self.leads), self.trainer.device)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def _everyone(mine: dict[int, float], n: int, device) -> dict[int, float]:
    import torch.distributed as dist

    values = torch.zeros(n, dtype=torch.float64)
    for i, v in mine.items():
        values[i] = v
    values = values.to(device)
    dist.all_reduce(values)
    return {i: float(v) for i, v in enumerate(values.cpu())}


def open_instances(ctx, trainer, *, eos_id, resumed_engine_draft=None) -> Instances:
    return Instances(ctx, trainer, eos_id=eos_id, resumed_engine_draft=resumed_engine_draft)


__all__ = ["Instances", "open_instances", "Path"]
