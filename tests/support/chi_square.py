"""A two-sample chi-square homogeneity test of sampled token ids, for the rollout engines' sampling-law tests."""

from __future__ import annotations

import torch


def p_value(a: torch.Tensor, b: torch.Tensor, vocab: int) -> float:
    """Two equal-size samples of token ids in [0, vocab); bins with fewer than 10 tokens in both samples together
    are pooled into one. The p-value is the chi-square survival function, gammaincc(df / 2, statistic / 2)."""
    counts_a, counts_b = torch.bincount(a, minlength=vocab), torch.bincount(b, minlength=vocab)
    total = counts_a + counts_b
    small = total < 10
    ca = torch.cat([counts_a[~small], counts_a[small].sum()[None]]).double()
    cb = torch.cat([counts_b[~small], counts_b[small].sum()[None]]).double()
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    statistic = ((ca - cb) ** 2 / (ca + cb)).sum()
    df = ca.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), statistic / 2))
