"""Speculative sampling's verify rule (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv
2302.01318): draft token x from q is kept with probability min(1, p(x)/q(x)); the first rejected position is
resampled from norm(max(0, p - q)); when all k survive, a bonus token comes from p. The output is distributed
exactly as sampling from p alone. At temperature 0 it is greedy: a draft is kept iff it is the target's argmax."""

from __future__ import annotations

import torch


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 sampling probabilities at ``temperature`` (> 0)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The chance of keeping a draft token: min(1, p(x)/q(x)) (q(x) > 0 since x was drawn from q)."""
    return torch.clamp(p_x / q_x, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over (V,); p itself where p <= q everywhere (then p == q and no rejection happens)."""
    rest = torch.clamp(p - q, min=0.0)
    total = rest.sum()
    return rest / total if total > 0 else p


def verify_sampled(
    p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator
) -> tuple[list[int], int]:
    """p (k+1, V) target probabilities after the context and after each draft; q (k, V) the draft's; drafts the k
    proposed ids. Returns (the accepted drafts + one resampled or bonus token, the number accepted)."""
    out: list[int] = []
    for j, x in enumerate(drafts):
        keep = accept_probability(p[j, x], q[j, x])
        if torch.rand((), generator=generator) < keep:
            out.append(x)
            continue
        out.append(int(torch.multinomial(residual(p[j], q[j]), 1, generator=generator)))
        return out, j
    out.append(int(torch.multinomial(p[len(drafts)], 1, generator=generator)))
    return out, len(drafts)


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[list[int], int]:
    """logits (k+1, V): the longest prefix of drafts equal to the target's argmax, then the target's own token."""
    verdict = logits.argmax(-1).tolist()
    a = 0
    while a < len(drafts) and drafts[a] == verdict[a]:
        a += 1
    return verdict[: a + 1], a
