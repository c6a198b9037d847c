"""GrpoTrainer: CoTrainer with the next-token loss swapped for NeMo-RL's clipped policy-gradient loss on the
response tokens. The old log-probs (and a frozen reference policy's, for the KL term) come from forward-only
passes of megatron's schedule over the same microbatches before the update; the draft trains on the update's own
forward from TapChannel taps exactly as in cotrain.
"""

from __future__ import annotations

import torch

from specdraft.runtime.models.vocab.parallel import mask_padding
from specdraft.runtime.rl.loss import ClipSettings, clipped_pg_sums
from specdraft.runtime.train.batches import global_counts, make_microbatch
from specdraft.runtime.train.trainer import CoTrainer


class GrpoTrainer(CoTrainer):
    def __init__(self, ctx):
        super().__init__(ctx)
        g = ctx.plan.grpo
        self.settings = ClipSettings(g.ratio_clip_min, g.ratio_clip_max, g.reference_policy_kl_penalty)
        self.mode = "sft"  # sft (next-token loss), logp (record log-probs), or grpo (the clipped loss)
        self.logp: dict[int, torch.Tensor] = {}  # the last forward-only pass's log-probs per microbatch
        self.old_logp: dict[int, torch.Tensor] = {}
        self.ref_logp: dict[int, torch.Tensor] = {}
        # The frozen reference policy (kl penalty > 0): this rank's parameters as RL starts; held from the start so
        # that every checkpoint carries it (a restore overwrites it).
        self.reference: list[torch.Tensor] | None = None
        if self.settings.kl_penalty:
            self.reference = [p.detach().clone() for p in self.target_params.all()]

    # ------------------------------------------------------------------------------------------------ per step
    def begin_rows(self, step: int, rows, advantages) -> None:
        """begin_step with the step's rows given (GRPO samples or SFT answers) rather than drawn from data."""
        self.step = step
        per = self.num_microbatches
        self.n_target, self.n_draft = global_counts(rows, self.steps_ttt)
        lo = self.dp_rank * per
        self.microbatches = []
        for i, (row, adv) in enumerate(zip(rows[lo : lo + per], advantages[lo : lo + per])):
            mb = make_microbatch(i, row, cp=self.cp, cp_rank=self.cp_rank, steps=self.steps_ttt, device=self.device)
            mb.advantages = self._shard(adv, row).to(torch.float32)  # type: ignore[attr-defined]  # (t,) local
            self.microbatches.append(mb)

    def _shard(self, x: torch.Tensor, row) -> torch.Tensor:
        from specdraft.runtime.attention.branch import zigzag_shard

        if self.cp == 1:
            return x.to(self.device)
        return zigzag_shard(x, row.cu_seqlens, self.cp, self.cp_rank, dim=-1).to(self.device)

    def set_training(self, train: bool) -> None:
        """Taps and the draft run only in the update's forward, never in the forward-only log-prob passes; a
        frozen draft (grpo.draft_mode) trains in the SFT warm-up only: after it, no draft loss, step or refit."""
        frozen = self.plan.grpo.draft_mode == "frozen" and self.step >= self.plan.grpo.sft_steps
        self.cotraining = train and self.draft_enabled and self.step >= self.warmup_steps and not frozen
        self.channel.active = self.cotraining
        self.channel.begin_step(self.num_microbatches if self.cotraining else 0)
        zero = [0.0] * self.steps_ttt
        self.stats = {"target_sum": 0.0, "kl": list(zero), "match": list(zero), "accepted": 0.0, "positions": 0.0}
        self.stats.update(pg=0.0, ref_kl=0.0, clipped=0.0)
        self.draft_timer.reset()

    # ------------------------------------------------------------------------------------------------ reference
    @torch.no_grad()
    def take_reference(self) -> None:
        """The policy now becomes the reference (after the SFT warm-up)."""
        for p, r in zip(self.target_params.all(), self.reference or ()):
            r.copy_(p)

    @torch.no_grad()
    def swap_reference(self) -> None:
        """Exchange the parameters' values with the reference's (twice restores them)."""
        for p, r in zip(self.target_params.all(), self.reference or ()):
            saved = p.detach().clone()
            p.copy_(r)
            r.copy_(saved)

    # ------------------------------------------------------------------------------------------------ the loss
    def loss(self, chunk: int, mb, output: torch.Tensor):
        if self.mode == "sft":
            return super().loss(chunk, mb, output)
        from megatron.core import tensor_parallel

        logits = output.transpose(0, 1).float()  # (1, t, V/tp) -> (t, 1, V/tp)
        logits = mask_padding(logits, self.plan.model.vocab_size, self.ps.get_tensor_model_parallel_rank())
        local = logits.detach().squeeze(1).clone()  # (t, V/tp): the draft's target (CE works in place)
        logp = -tensor_parallel.vocab_parallel_cross_entropy(logits.contiguous(), mb.labels[:, None]).squeeze(1)
        if self.mode == "logp":
            self.logp[mb.index] = logp.detach()
            return logp.sum() * 0, torch.tensor(1, dtype=torch.int), {}
        ref = self.ref_logp.get(mb.index)
        total, sums = clipped_pg_sums(logp, self.old_logp[mb.index], mb.advantages, mb.loss_mask, ref, self.settings)
        if self.ps.get_tensor_model_parallel_rank() == 0:
            for key, name in (("pg", "pg"), ("ref_kl", "kl"), ("clipped", "clipped")):
                self.stats[key] += sums[name].double()
        total = total / max(self.n_target, 1.0)
        if self.cotraining:
            if self.draft_in_loss:
                total = total + self.loss_weight * self.run_draft(mb, local)
            else:
                self.channel.put(chunk, "logits", local.to(self.dtype))
        return total * self.num_microbatches, torch.tensor(1, dtype=torch.int), {}
