"""CoTrainer: one rank's target chunks, draft, optimizers, TapChannel and per-step accounting."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from specdraft.runtime.attention.halo import gather_shifted, shift_rows
from specdraft.runtime.context import RankContext
from specdraft.runtime.models import eagle3_import
from specdraft.runtime.models.core_attention import attention_summary
from specdraft.runtime.models.draft import Eagle3Draft, draft_shape
from specdraft.runtime.models.hf.checkpoint import plan_checkpoint
from specdraft.runtime.models.hf.mapping import padded_vocab
from specdraft.runtime.models.target import build_chunks, init_parameters, transformer_config
from specdraft.runtime.models.vocab.parallel import accept_length, head_kl_and_matches, log_softmax, mask_padding
from specdraft.runtime.models.vocab.reduced import Restriction, draft_vocabulary
from specdraft.runtime.train import precision
from specdraft.runtime.train.activations import SavedActivations
from specdraft.runtime.train.batches import global_counts, make_microbatch
from specdraft.runtime.train.devicetime import DeviceTimer
from specdraft.runtime.train.grads import TargetParams
from specdraft.runtime.train.packing import data_for
from specdraft.runtime.train.tapchannel import TapChannel

BLOCKING_ENV = "SPECDRAFT_TAPS_BLOCKING"  # benchmark baseline: blocking send/recv of the taps inside the hooks
AUDIT_ENV = "SPECDRAFT_TAP_AUDIT"  # tests: record a sha256 of every tap sent and received
SYNTHETIC_ENV = "SPECDRAFT_TAPS_SYNTHETIC"  # benchmark control: no tap transport, zero taps of the right shapes


class CoTrainer:
    def __init__(self, ctx: RankContext, data=None):
        """``data``: the source of the step's rows (its position is what checkpoints record); None: the plan's data
        file packed into rows, or the built-in Markov chain (packing.data_for)."""
        from megatron.core import parallel_state as ps

        plan = ctx.plan
        self.ctx, self.plan, self.ps = ctx, plan, ps
        par, m, d, t = plan.parallel, plan.model, plan.draft, plan.training
        self.device = torch.device(ctx.device)
        # The spec's dtype on every device: bf16/fp16 parameters with fp32 main weights (precision.py).
        self.precision = precision.Policy.of(t)
        self.dtype = self.precision.param_dtype
        me = ctx.coords
        self.pp_rank, self.tp, self.cp, self.cp_rank = me.pp, par.tp, par.cp, me.cp
        self.dp, self.dp_rank, self.num_microbatches = par.dp, me.dp, plan.num_microbatches
        if par.vpp and self.num_microbatches % par.pp:
            raise ValueError(
                f"the interleaved schedule needs num_microbatches ({self.num_microbatches}) to be a "
                f"multiple of pp ({par.pp}); change training.global_batch_size"
            )
        self.row_tokens = par.micro_batch_size * m.seq_length
        self.steps_ttt = d.ttt_steps
        self.seed = t.seed
        torch.manual_seed(self.seed)
        # model.path naming a HF folder: the policy starts from its weights (a checkpoint restored later wins).
        checkpoint = plan_checkpoint(plan)
        self.policy_init = str(checkpoint.folder) if checkpoint is not None else "random"
        self.chunks = build_chunks(plan, self.pp_rank, self.device, self.dtype, self.seed, checkpoint=checkpoint)
        # which attention kernels run (for metrics.jsonl); the draft shares the target's head_dim
        self.attention = attention_summary(self.device, self.dtype, m.head_dim, plan.draft.enabled)
        self.is_last = self.pp_rank == par.pp - 1
        self.target_params = TargetParams.of(self.chunks)
        self.grad_bytes = 0  # the target's grads at the last optimizer step (state_bytes)
        self.optimizer = precision.MainOptimizer(
            self.target_params.all(),
            lr=t.lr,
            policy=self.precision,
            device=self.device,
            shards=self._optimizer_shards(ps, t),
        )
        self.loss_scaler = precision.LossScaler() if self.precision.loss_scaling else None
        for chunk in self.chunks:  # megatron's schedule scales the last stage's loss before backward with it
            chunk.config.grad_scale_func = self.loss_scaler.scale_loss if self.loss_scaler else None
        self.step_report: dict = {}
        self.data = data if data is not None else data_for(ctx)
        self.loss_weight, self.clip, self.draft_clip = d.loss_weight, t.clip_grad, d.clip_grad
        self.warmup_steps = t.warmup_steps
        self.cotraining = False
        self.draft_enabled = plan.draft.enabled
        self.draft_stage = plan.draft.stage
        self.draft = None
        self.draft_init = "random"
        if self.draft_enabled and self.pp_rank == self.draft_stage:
            # The draft's layers never see sequence-parallel activations (taps are gathered over tp first).
            config = dataclasses.replace(transformer_config(plan, self.dtype, self.device), sequence_parallel=False)
            self.draft = Eagle3Draft(draft_shape(plan), config).to(self.device, self.dtype)
            init_parameters(self.draft, 0, self.tp, self.seed ^ 0x5EED, vocab=self.draft.shape.vocab)
            if self.draft.vocab is not None:  # a checkpoint's mapping, if one is loaded, replaces this one
                self.draft.vocab.set(*(x.to(self.device) for x in draft_vocabulary(self.data, plan)))
            # draft.path: a published EAGLE-3 checkpoint's weights (and d2t/t2d), this rank's slices only
            source = eagle3_import.open_source(plan)
            if source is not None:
                eagle3_import.load(self.draft, source, plan, ps.get_tensor_model_parallel_rank())
                self.draft_init = str(source.folder)
            self.draft_optimizer = precision.MainOptimizer(
                list(self.draft.parameters()),
                lr=d.lr,
                policy=self.precision,
                device=self.device,
                warmup_steps=d.lr_warmup_steps,
            )
        self._restriction = None
        self.draft_in_loss = self.draft is not None and self.is_last
        self.cp_group = ps.get_context_parallel_group() if self.cp > 1 else None
        self.tp_group = ps.get_tensor_model_parallel_group() if self.tp > 1 else None
        self.sequence_parallel = par.sequence_parallel
        self.channel = self._channel(plan, ctx, m)
        self.sends_embedding = any(r.tap == "embedding" and r.src_rank == ctx.global_rank for r in plan.tap_routes)
        self.stats: dict = {}
        self.draft_timer = DeviceTimer(self.device)
        self.meter: SavedActivations | None = None  # set for a measured step (workloads/cotrain.py)
        self.measured: dict | None = None  # its saved-for-backward bytes per microbatch (keep_measurement)

    def _channel(self, plan, ctx, m) -> TapChannel:
        tokens = self.row_tokens // self.cp
        sp_tokens = tokens // self.tp if plan.parallel.sequence_parallel else tokens
        h = m.hidden_size
        shapes = {"logits": (tokens, padded_vocab(m.vocab_size, self.tp) // self.tp)}
        shapes.update({layer: (sp_tokens, h) for layer in plan.draft.aux_layers})

        def shape(tap, m_index):
            if tap == "embedding":  # one row per distinct token the TTT streams need: data dependent
                rows = len(self.microbatches[m_index].emb_ids)
                return (-(-rows // self.tp) if self.sequence_parallel else rows, h)
            return shapes[tap]

        audit = ctx.paths.taps if os.environ.get(AUDIT_ENV) == "1" else None
        channel = TapChannel(
            plan,
            ctx.global_rank,
            shape=shape,
            dtype=self.dtype,
            device=self.device,
            blocking=os.environ.get(BLOCKING_ENV) == "1",
            synthetic=os.environ.get(SYNTHETIC_ENV) == "1",
            audit_dir=audit,
        )
        for v, chunk in enumerate(self.chunks):
            channel.hook_layers(chunk, v, plan.stages[self.pp_rank].chunks[v].first_layer)
        return channel

    # ------------------------------------------------------------------------------------------------ per step
    def begin_step(self, step: int) -> None:
        self.step = step
        rows_per_rank = self.num_microbatches
        rows = self.data.step_rows(step, rows_per_rank * self.dp)
        self.n_target, self.n_draft = global_counts(rows, self.steps_ttt)
        mine = rows[self.dp_rank * rows_per_rank : (self.dp_rank + 1) * rows_per_rank]
        self.microbatches = [
            make_microbatch(i, row, cp=self.cp, cp_rank=self.cp_rank, steps=self.steps_ttt, device=self.device)
            for i, row in enumerate(mine)
        ]
        # Warm-up steps train the policy alone: no taps travel and the draft does not run.
        self.cotraining = self.draft_enabled and step >= self.warmup_steps
        self.channel.active = self.cotraining
        self.channel.begin_step(self.num_microbatches if self.cotraining else 0)
        # Sums stay on the device (no host sync per microbatch); metrics.record reads them once per step.
        self.stats = {
            "target_sum": 0.0,
            "kl": [0.0] * self.steps_ttt,
            "match": [0.0] * self.steps_ttt,
            "accepted": 0.0,
            "positions": 0.0,
        }
        self.draft_timer.reset()

    @torch.no_grad()
    def put_embedding(self, model, mb) -> None:
        """Stage 0: embeddings of the tokens x_{p+1+j} the draft's TTT steps read (each distinct token once)."""
        if not self.cotraining or (not self.sends_embedding and "embedding" not in self.channel.local_taps):
            return
        if self.sequence_parallel:
            # Like the hidden taps, each TP rank ships 1/tp of the rows (padded): the embedding itself
            # reduce-scatters its output over tp under sequence parallelism, (1, n_pad) -> (n_pad/tp, 1, h).
            per = -(-len(mb.emb_ids) // self.tp)
            ids = F.pad(mb.emb_ids, (0, per * self.tp - len(mb.emb_ids)))
            emb = model.embedding.word_embeddings(ids[None])[:, 0]
        else:
            emb = model.embedding.word_embeddings(mb.emb_ids[None])[0]  # (n,) -> (n, h)
        self.channel.put(0, "embedding", emb.to(self.dtype))

    def loss(self, chunk: int, mb, output: torch.Tensor):
        """Last stage: target cross-entropy (+ the draft's loss when the draft lives here), globally normalised.

        Megatron divides what this returns by num_tokens (1 here) and num_microbatches, so the sum over
        microbatches and data/context ranks is the mean over the global batch, the same in every layout.
        """
        from megatron.core import tensor_parallel

        logits = output.transpose(0, 1).float()  # (1, t, V/tp) -> (t, 1, V/tp)
        # The vocabulary's padding to a tp multiple takes no part in the loss, the draft's targets or an argmax.
        logits = mask_padding(logits, self.plan.model.vocab_size, self.ps.get_tensor_model_parallel_rank())
        # A detached copy first: megatron's vocab-parallel cross-entropy exponentiates its input in place.
        local = logits.detach().squeeze(1).clone()  # (t, V/tp)
        ce = tensor_parallel.vocab_parallel_cross_entropy(logits.contiguous(), mb.labels[:, None])
        target_sum = (ce.squeeze(1) * mb.loss_mask).sum()
        if self.ps.get_tensor_model_parallel_rank() == 0:
            self.stats["target_sum"] += target_sum.detach().double()
        total = target_sum / self.n_target
        if self.cotraining:
            if self.draft_in_loss:
                with self.measuring("draft", mb.index):
                    total = total + self.loss_weight * self.run_draft(mb, local)
            else:
                self.channel.put(chunk, "logits", local.to(self.dtype))
        return total * self.num_microbatches, torch.tensor(1, dtype=torch.int), {}

    def run_draft(self, mb, local_logits: torch.Tensor | None = None) -> torch.Tensor:
        """The draft's TTT forward for one microbatch; returns its globally normalised loss (graph attached).

        ``local_logits`` are the policy's vocab-parallel logits when the draft shares the last stage; elsewhere
        they arrive as the `logits` tap.
        """
        taps = self.channel.receive(mb.index)
        timing = self.draft_timer.start()  # the draft's own compute: waiting for taps is TapChannel's cost
        logits = taps["logits"] if local_logits is None else local_logits
        shifts = [1 + j for j in range(self.steps_ttt)]
        valid = mb.draft_valid
        if self.draft.vocab is None:
            target_logp = log_softmax(logits, self.tp_group)  # this rank's vocab slice of the policy's log-probs
        else:
            # The policy's log-probs renormalised over the draft vocabulary, in the draft head's layout; rows whose
            # policy top-1 the draft vocabulary lacks leave the KL (vocab_map.py).
            restriction = self.restriction()
            target_logp = restriction.log_probs(logits)
            kept = shift_rows(restriction.top1_kept(logits), shifts, mb.cu_seqlens, self.cp_group)  # (S, t)
            valid = valid * kept
        aux_layers = self.plan.draft.aux_layers
        aux = torch.stack([taps[layer] for layer in aux_layers]).to(self.dtype)  # (n_taps, t, h)
        table = taps["embedding"].to(self.dtype)  # (n, h), or (ceil(n/tp), h) per TP rank under SP
        if self.sequence_parallel:
            aux, table = self._gather_sp(aux, dim=1), self._gather_sp(table, dim=0)[: len(mb.emb_ids)]
        table = torch.cat([table, table.new_zeros(1, table.shape[1])])  # row -1: past the sequence end
        emb = table[mb.emb_index]  # (S, t, h): step j's input token embeddings
        # Step j is trained towards the target at row p+1+j: (avail, index) addresses it without S copies.
        avail, index = gather_shifted(target_logp, shifts, mb.cu_seqlens, self.cp_group)
        hiddens = self.draft.ttt(aux, emb, mb.draft_positions, mb.cu_seqlens, self.cp_group)
        kl_sums, matches = head_kl_and_matches(self.draft.head, hiddens, avail, index, valid, self.tp_group)
        loss = sum(kl / max(n, 1.0) for kl, n in zip(kl_sums, self.n_draft)) / self.steps_ttt
        if self.ps.get_tensor_model_parallel_rank() == 0:
            for j in range(self.steps_ttt):
                self.stats["kl"][j] += kl_sums[j].detach().double()
                self.stats["match"][j] += matches[j].sum()
            accepted, positions = accept_length(matches, mb.draft_valid[0])
            self.stats["accepted"] += accepted
            self.stats["positions"] += positions
        self.draft_timer.stop(timing)
        return loss

    def restriction(self) -> Restriction:
        """The draft vocabulary's restriction of the policy's logits, built from the draft's own t2d once a
        checkpoint (whose mapping the head was trained with) had its chance to load."""
        if self._restriction is None:
            # t2d covers the target's vocabulary; its padding to a tp multiple is never kept
            self._restriction = Restriction(
                self.draft.vocab.t2d, self.tp_group, padded_vocab(self.plan.model.vocab_size, self.tp)
            )
        return self._restriction

    def _gather_sp(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Undo sequence parallelism for the draft: concatenate the TP ranks' row shards along ``dim``."""
        parts = [torch.empty_like(x) for _ in range(self.tp)]
        dist.all_gather(parts, x.contiguous(), group=self.tp_group)
        return torch.cat(parts, dim=dim)

    def draft_after_schedule(self) -> None:
        """A draft off the last stage runs once the schedule is done, microbatch by microbatch."""
        if self.draft is None or self.draft_in_loss or not self.cotraining:
            return
        for mb in self.microbatches:
            with self.measuring("draft", mb.index):
                loss = self.run_draft(mb)
            precision.scaled(self.loss_weight * loss, self.loss_scaler).backward()

    # ------------------------------------------------------------------------------------ activation bytes
    def new_meter(self) -> SavedActivations | None:
        """A meter for this step, unless one step was measured already: parameters and buffers are excluded."""
        if self.measured is not None:
            return None
        modules = [*self.chunks, *([self.draft] if self.draft is not None else [])]
        return SavedActivations(exclude=[t for m in modules for t in (*m.parameters(), *m.buffers())])

    def measuring(self, kind: str, index: int):
        return self.meter.scope((kind, index)) if self.meter is not None else contextlib.nullcontext()

    def measured_loss(self, chunk: int, mb, output: torch.Tensor):
        """`loss` with what it saves for backward counted towards this microbatch's target activations."""
        with self.measuring("target", mb.index):
            return self.loss(chunk, mb, output)

    def keep_measurement(self) -> None:
        """Per microbatch, the bytes saved for backward by the target (all of this stage's chunks and its loss)
        and by the draft; plan.memory's per-microbatch activation estimate describes the first."""
        if self.meter is None:
            return
        meter, self.meter = self.meter, None
        self.measured = {
            f"{prefix}activations_per_microbatch": [meter.bytes((kind, mb.index)) for mb in self.microbatches]
            for kind, prefix in (("target", ""), ("draft", "draft_"))
        }
        if meter.debug:
            self.measured["listing"] = {f"{k[0]}-{k[1]}": v for k, v in meter.listing.items() if k[1] == 0}

    def _optimizer_shards(self, ps, t) -> list | None:
        """training.distributed_optimizer: the target's main weights and AdamW state split over the ranks that
        replicate them (dense: dp x cp; experts: expert dp), as the memory estimate assumes."""
        if not t.distributed_optimizer:
            return None
        shards = [(list(self.target_params.dense), ps.get_data_parallel_group(with_context_parallel=True))]
        if self.target_params.experts:
            shards.append((list(self.target_params.experts), ps.get_expert_data_parallel_group()))
        return shards

    def optimizer_steps(self) -> None:
        """Reduce, unscale, check, clip and step both models' optimizers (precision.optimizer_steps)."""
        self.step_report = precision.optimizer_steps(self)

    def state_bytes(self) -> dict:
        """What this rank holds for the target, measured (plan.memory estimates the same three per stage)."""
        params = self.target_params.all()
        return {
            "weights": sum(p.nbytes for p in params),
            "grads": self.grad_bytes,
            "optimizer": self.optimizer.state_bytes(),
            "num_params": sum(p.numel() for p in params),
            **(self.measured or {}),
        }
