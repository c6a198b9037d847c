"""The reduced draft vocabulary: which target tokens the draft's LM head predicts (SpecForge's d2t/t2d), and the
target distribution restricted to them for the KL.

Counting follows SpecForge (`generate_vocab_mapping_file` / `process_token_dict_to_mappings`): the tokens that carry
loss (here a row's labels where its loss mask is 1) are counted over the data the draft trains on: the seeded rows
of steps [training.warmup_steps, training.train_iters), or each sample of a data file once (SpecForge counts its
dataset). The Vd most frequent are kept, ties going to the smaller id, and when fewer than Vd distinct tokens occur
the smallest unseen ids fill up (SpecForge pads the same way). The kept ids, sorted, are the draft vocabulary: draft
id i is target id i + d2t[i]; t2d[v] is True for a kept target id v.

Restriction, as SpecForge's `_compute_target_p`: the target's logits at the kept columns, softmax over those only
(renormalised: p'(v) = p(v) / sum over kept u of p(u)); a position whose target top-1 is not kept is masked out of
the KL (the draft cannot propose it) and counts as a miss for acceptance.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.plan.memory import HEAD_CHUNK_TOKENS
from specdraft.plan.model import LaunchPlan
from specdraft.runtime.models.vocab.parallel import argmax, log_softmax


def mapping(counts: torch.Tensor, draft_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t (Vd,) int64, t2d (V,) bool) from token counts: the Vd most frequent ids (ties: smaller id first)."""
    if not 1 <= draft_vocab <= counts.numel():
        raise ValueError(f"draft vocabulary {draft_vocab} must be in 1..{counts.numel()} (the target's)")
    order = torch.sort(-counts, stable=True).indices  # stable: equal counts keep ascending id order
    kept = torch.sort(order[:draft_vocab]).values
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[kept] = True
    return kept - torch.arange(draft_vocab), t2d


def draft_vocabulary(data, plan: LaunchPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of ``plan``'s run: the same on every rank (a function of the spec and the seeded data only), from
    the data's loss-bearing label counts (``data.label_counts()``: the Markov chain's trained rows, each sample of a
    data file once as SpecForge counts its dataset, a GRPO run's reference answers)."""
    return mapping(data.label_counts(), plan.draft.vocab_size)


class Restriction:
    """The target's vocab-parallel logits restricted to the draft vocabulary, in the draft head's layout.

    Target rank r holds target columns [r V/tp, (r+1) V/tp); draft rank r holds draft columns [r Vd/tp, (r+1)
    Vd/tp). Draft ids are sorted target ids, so the kept columns of target shard 0, then shard 1, ... are the draft
    vocabulary in order: each rank selects its kept columns, one all-gather per chunk of rows assembles them (the
    shards keep different counts, so each is padded to the largest), and each rank keeps its draft slice.
    """

    def __init__(self, t2d: torch.Tensor, group=None, padded: int | None = None):
        self.group = group
        self.tp = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        if padded is not None and padded > t2d.numel():  # the target vocabulary's padding to a tp multiple: never kept
            t2d = torch.cat([t2d, t2d.new_zeros(padded - t2d.numel())])
        self.t2d = t2d
        per = t2d.numel() // self.tp
        shards = t2d.view(self.tp, per)
        self.counts = [int(c) for c in shards.sum(1)]
        self.local_cols = shards[self.rank].nonzero().squeeze(1)  # (n_r,) kept columns of this target shard
        self.draft_per_rank = sum(self.counts) // self.tp

    @torch.no_grad()
    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(t, V/tp) target logits -> (t, Vd/tp): this rank's slice of the renormalised log-probs over the draft
        vocabulary (fp32, no gradient)."""
        picked = logits[:, self.local_cols].float()  # (t, n_r)
        if self.tp == 1:
            return torch.log_softmax(picked, dim=-1)
        width = max(self.counts)
        lo = self.rank * self.draft_per_rank
        parts = []
        for c0 in range(0, picked.shape[0], HEAD_CHUNK_TOKENS):
            block = picked[c0 : c0 + HEAD_CHUNK_TOKENS]
            padded = torch.nn.functional.pad(block, (0, width - block.shape[1]))  # (c, width)
            gathered = [torch.empty_like(padded) for _ in range(self.tp)]
            dist.all_gather(gathered, padded.contiguous(), group=self.group)
            full = torch.cat([g[:, :n] for g, n in zip(gathered, self.counts)], dim=1)  # (c, Vd), draft order
            parts.append(full[:, lo : lo + self.draft_per_rank])
        return log_softmax(torch.cat(parts), self.group)

    @torch.no_grad()
    def top1_kept(self, logits: torch.Tensor) -> torch.Tensor:
        """(t, V/tp) target logits -> (t,) 1.0 where the target's top-1 (over its whole vocabulary) is kept."""
        return self.t2d[argmax(logits, self.group)].to(torch.float32)
