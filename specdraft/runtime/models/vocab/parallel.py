"""Softmax statistics and the draft's KL over vocab-parallel logits (each TP rank holds V/tp columns).

log p = x - logsumexp(x) needs the global max and sum of exponentials: one all-reduce each. The KL's gradient is
written out (softmax(draft) - p_target on the local columns, cf. megatron's vocab_parallel_cross_entropy), so the
backward needs no communication and no rank's partial loss double-counts the shared normaliser.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.plan.memory import HEAD_CHUNK_TOKENS  # rows per checkpointed LM-head + KL chunk: one constant


def mask_padding(logits: torch.Tensor, vocab_size: int, rank: int = 0) -> torch.Tensor:
    """(..., Vp/tp) vocab-parallel logits of tp rank ``rank`` with the columns past ``vocab_size`` (the padding of
    the vocabulary to a tp multiple) set to the dtype's lowest value: a finite floor, so softmaxes give them
    probability 0 exactly, argmax never picks them, and a KL term p * (log p - log q) there is 0 * finite = 0
    (with -inf it would be 0 * nan). Out of place, so autograd gives those columns a zero gradient."""
    width = logits.shape[-1]
    real = min(max(vocab_size - rank * width, 0), width)
    if real == width:
        return logits
    padded = torch.arange(width, device=logits.device) >= real
    return logits.masked_fill(padded, torch.finfo(logits.dtype).min)


def _single(group) -> bool:
    return group is None or dist.get_world_size(group) == 1


@torch.no_grad()
def log_softmax(logits: torch.Tensor, group=None) -> torch.Tensor:
    """(t, V/tp) local logits -> (t, V/tp) local slice of the global log-softmax (no gradient; fp32 or wider)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if _single(group):
        return torch.log_softmax(x, dim=-1)
    peak = x.amax(dim=-1, keepdim=True)  # (t, 1)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    total = (x - peak).exp().sum(-1, keepdim=True)
    dist.all_reduce(total, group=group)
    return x - peak - total.log()


class _VocabParallelKL(torch.autograd.Function):
    """KL(target || softmax(x)) per row, x vocab-parallel. d KL / d x = softmax(x) - p_target (local columns)."""

    @staticmethod
    def forward(ctx, logits, target_logp, group):
        logp = log_softmax(logits, group)  # (t, V/tp)
        p_target = target_logp.exp()
        kl = (p_target * (target_logp - logp)).sum(-1)  # (t,) partial over local columns
        if not _single(group):
            dist.all_reduce(kl, group=group)
        ctx.save_for_backward(logp, p_target)
        ctx.out_dtype = logits.dtype
        return kl

    @staticmethod
    def backward(ctx, grad):
        logp, p_target = ctx.saved_tensors
        return ((logp.exp() - p_target) * grad[:, None]).to(ctx.out_dtype), None, None


def vocab_parallel_kl(logits: torch.Tensor, target_logp: torch.Tensor, group=None) -> torch.Tensor:
    """(t, V/tp) draft logits, (t, V/tp) detached target log-probs -> (t,) KL(target || draft)."""
    return _VocabParallelKL.apply(logits, target_logp, group)


@torch.no_grad()
def argmax(logits: torch.Tensor, group=None) -> torch.Tensor:
    """Global vocabulary index of each row's maximum. (t, V/tp) -> (t,) int64."""
    value, index = logits.max(dim=-1)
    if group is None or dist.get_world_size(group) == 1:
        return index
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    index = index + rank * logits.shape[-1]
    values = [torch.empty_like(value) for _ in range(size)]
    indices = [torch.empty_like(index) for _ in range(size)]
    dist.all_gather(values, value, group=group)
    dist.all_gather(indices, index, group=group)
    best = torch.stack(values).argmax(dim=0)  # (t,): which rank holds the maximum (lowest rank on ties)
    return torch.stack(indices).gather(0, best[None]).squeeze(0)


def head_kl_and_matches(
    head,
    hiddens: list[torch.Tensor],
    target_avail: torch.Tensor,
    target_index: torch.Tensor,
    valid: torch.Tensor,
    group=None,
    chunk: int = HEAD_CHUNK_TOKENS,
):
    """Per TTT step: the sum over valid rows of KL(target || draft), and top-1 match indicators.

    hiddens: S tensors (t, h), the draft's output per step; head(h) -> (rows, V/tp) vocab-parallel logits.
    target_avail (n, V/tp): detached target log-probs, target_index (S, t) its row for (step, row) or -1; valid
    (S, t) 0/1. The head and the KL run in checkpointed token chunks, so no step's full (t, V/tp) logits, draft
    log-probs or shifted target stay alive for backward: at long contexts those dominate the draft's memory.
    """
    from torch.utils.checkpoint import checkpoint

    def piece(h, index, mask):
        logits = head(h)  # (rows, V/tp)
        target = target_avail[index.clamp(min=0)]  # rows past a sequence end are masked out below
        kl = (vocab_parallel_kl(logits, target, group) * mask).sum()
        return kl, (argmax(logits, group) == argmax(target, group)) & mask.bool()

    kl_sums, matches = [], []
    for j, hidden in enumerate(hiddens):
        kl, match = hidden.new_zeros((), dtype=torch.float32), []
        for c0 in range(0, hidden.shape[0], chunk):
            c1 = min(c0 + chunk, hidden.shape[0])
            part, hit = checkpoint(piece, hidden[c0:c1], target_index[j, c0:c1], valid[j, c0:c1], use_reentrant=False)
            kl = kl + part
            match.append(hit)
        kl_sums.append(kl)
        matches.append(torch.cat(match))
    return kl_sums, matches


def accept_length(matches: list[torch.Tensor], valid0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over positions of tokens accepted per verify step, number of positions), as device scalars (read once
    per step by the metrics, so no host sync per microbatch).

    A verify step accepts the longest prefix of draft tokens that match the target's top-1, plus the target's
    own (bonus) token: 1 + the count of leading matching TTT steps at that position.
    """
    run = torch.ones_like(matches[0], dtype=torch.bool)
    accepted = valid0.clone()
    for m in matches:
        run = run & m
        accepted = accepted + run.to(accepted.dtype)
    return accepted.sum(), valid0.sum()
