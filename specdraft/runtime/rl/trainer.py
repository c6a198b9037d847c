"""GrpoTrainer: CoTrainer with NeMo-RL's clipped policy-gradient loss on the response tokens. Its passes are methods
that take what they need (rows, log-probs) and return what they measure; nothing outside sets its state. The draft
trains on the update's own forward from TapChannel taps exactly as in cotrain; the log-prob passes run no draft.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.runtime.models.vocab.parallel import mask_padding
from specdraft.runtime.rl.loss import ClipSettings, clipped_pg_sums
from specdraft.runtime.train.batches import global_counts, make_microbatch
from specdraft.runtime.train.schedule import run_schedule, schedule_pass
from specdraft.runtime.train.trainer import CoTrainer


class GrpoTrainer(CoTrainer):
    def __init__(self, ctx, data=None):
        """``data``: the run's prompt stream (prompts.FilePrompts or TaskPrompts), whose position checkpoints
        record; None: the plan's data as CoTrainer reads it."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        super().__init__(ctx, data)
        g = ctx.plan.grpo
        self.settings = ClipSettings(g.ratio_clip_min, g.ratio_clip_max, g.reference_policy_kl_penalty)
        self.forward_backward = get_forward_backward_func()
        self._loss = super().loss  # the loss of the pass under way: set by the pass itself, never from outside
        self._logp: dict[int, torch.Tensor] = {}
        self._old: dict[int, torch.Tensor] = {}
        self._ref: dict[int, torch.Tensor] = {}
        # The frozen reference policy (kl penalty > 0): this rank's parameters as RL starts; held from the start so
        # that every checkpoint carries it (a restore overwrites it).
        self.reference: list[torch.Tensor] | None = None
        if self.settings.kl_penalty:
            self.reference = [p.detach().clone() for p in self.target_params.all()]

    # ------------------------------------------------------------------------------------------------ the rows
    def begin_rows(self, step: int, rows, advantages) -> None:
        """This rank's microbatches from its own rows (batch.rank_samples' samples), with the step's global token
        counts summed over the data-parallel replicas, which hold the other samples."""
        if len(rows) != self.num_microbatches:
            raise ValueError(f"{len(rows)} rows for {self.num_microbatches} microbatches")
        self.step = step
        target, draft = global_counts(rows, self.steps_ttt)
        counts = torch.tensor([target, *draft], dtype=torch.float64, device=self.device)
        if self.dp > 1:
            dist.all_reduce(counts, group=self.ps.get_data_parallel_group())
        self.n_target, self.n_draft = float(counts[0]), [float(x) for x in counts[1:]]
        self.microbatches = []
        for i, (row, adv) in enumerate(zip(rows, advantages)):
            mb = make_microbatch(i, row, cp=self.cp, cp_rank=self.cp_rank, steps=self.steps_ttt, device=self.device)
            mb.advantages = self._shard(adv, row).to(torch.float32)  # type: ignore[attr-defined]  # (t,) local
            self.microbatches.append(mb)

    def _shard(self, x: torch.Tensor, row) -> torch.Tensor:
        from specdraft.runtime.attention.branch import zigzag_shard

        if self.cp == 1:
            return x.to(self.device)
        return zigzag_shard(x, row.cu_seqlens, self.cp, self.cp_rank, dim=-1).to(self.device)

    def set_training(self, train: bool) -> None:
        """Taps and the draft run only in a training pass, never in the forward-only log-prob passes; a frozen
        draft (grpo.draft_mode) trains in the SFT warm-up only: after it, no draft loss, step or refit."""
        frozen = self.plan.grpo.draft_mode == "frozen" and self.step >= self.plan.grpo.sft_steps
        self.cotraining = train and self.draft_enabled and self.step >= self.warmup_steps and not frozen
        self.channel.active = self.cotraining
        self.channel.begin_step(self.num_microbatches if self.cotraining else 0)
        zero = [0.0] * self.steps_ttt
        self.stats = {"target_sum": 0.0, "kl": list(zero), "match": list(zero), "accepted": 0.0, "positions": 0.0}
        self.stats.update(pg=0.0, ref_kl=0.0, clipped=0.0)
        self.draft_timer.reset()

    # ------------------------------------------------------------------------------------------------ the passes
    def sft_update(self) -> None:
        """A supervised step on the rows (reference answers): cotrain's next-token loss, the draft co-training."""
        self._loss = super().loss
        self.set_training(True)
        run_schedule(self, self.forward_backward)

    def logprobs(self, reference: bool = False) -> dict[int, torch.Tensor]:
        """The current (or, with ``reference``, the frozen reference) parameters' log-probs of every label of this
        rank's microbatches: (t,) per microbatch on the last stage, {} elsewhere."""
        if reference:
            self._swap_reference()
        try:
            self._loss, self._logp = self._record_logp, {}
            self.set_training(False)
            with torch.no_grad():
                schedule_pass(self, self.forward_backward, forward_only=True)
            self.channel.end_step()
        finally:
            if reference:
                self._swap_reference()
        return self._logp

    def pg_update(self, old: dict[int, torch.Tensor], ref: dict[int, torch.Tensor]) -> None:
        """One optimizer step of the clipped policy-gradient loss against the generating policy's log-probs
        ``old`` (and the reference's ``ref`` for the KL term)."""
        self._old, self._ref, self._loss = old, ref, self._pg_loss
        self.set_training(True)
        run_schedule(self, self.forward_backward)

    # ------------------------------------------------------------------------------------------------ reference
    @torch.no_grad()
    def take_reference(self) -> None:
        """The policy now becomes the reference (after the SFT warm-up)."""
        for p, r in zip(self.target_params.all(), self.reference or ()):
            r.copy_(p)

    @torch.no_grad()
    def _swap_reference(self) -> None:
        """Exchange the parameters' values with the reference's (twice restores them)."""
        for p, r in zip(self.target_params.all(), self.reference or ()):
            saved = p.detach().clone()
            p.copy_(r)
            r.copy_(saved)

    # ------------------------------------------------------------------------------------------------ the losses
    def loss(self, chunk: int, mb, output: torch.Tensor):
        return self._loss(chunk, mb, output)

    def _label_logp(self, mb, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the log-prob of each label (t,), this rank's vocab slice of the logits (t, V/tp), detached)."""
        from megatron.core import tensor_parallel

        logits = output.transpose(0, 1).float()  # (1, t, V/tp) -> (t, 1, V/tp)
        logits = mask_padding(logits, self.plan.model.vocab_size, self.ps.get_tensor_model_parallel_rank())
        local = logits.detach().squeeze(1).clone()  # (t, V/tp): the draft's target (CE works in place)
        logp = -tensor_parallel.vocab_parallel_cross_entropy(logits.contiguous(), mb.labels[:, None]).squeeze(1)
        return logp, local

    def _record_logp(self, chunk: int, mb, output: torch.Tensor):
        logp, _ = self._label_logp(mb, output)
        self._logp[mb.index] = logp.detach()
        return logp.sum() * 0, torch.tensor(1, dtype=torch.int), {}

    def _pg_loss(self, chunk: int, mb, output: torch.Tensor):
        logp, local = self._label_logp(mb, output)
        ref = self._ref.get(mb.index)
        total, sums = clipped_pg_sums(logp, self._old[mb.index], mb.advantages, mb.loss_mask, ref, self.settings)
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
