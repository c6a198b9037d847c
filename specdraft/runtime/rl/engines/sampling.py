"""Speculative sampling's verify rule (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv
2302.01318): draft token x from q is kept with probability min(1, p(x)/q(x)); the first rejected position is
resampled from norm(max(0, p - q)); when all k survive, a bonus token comes from p. The output is distributed
exactly as sampling from p alone. At temperature 0 it is greedy: a draft is kept iff it is the target's argmax."""

from __future__ import annotations

from typing import Sequence, Union

import torch
import torch.nn.functional as F

# One generator for a whole batch, or one per row: then a row's draws depend on that row alone, never on which
# other sequences share its batch (the samples of a prompt are the same on any instance, in any batch).
Generators = Union[torch.Generator, Sequence[torch.Generator]]


def uniform(b: int, k: int, generator: Generators, counts: torch.Tensor) -> torch.Tensor:
    """(b, k) uniform draws in [0, 1); with one generator per row, row i draws only its first counts[i] (the rest
    read 1.0, which keeps nothing), so its draws never depend on the batch's longest row."""
    if isinstance(generator, torch.Generator):
        return torch.rand(b, k, generator=generator)
    out = torch.ones(b, k)
    for i, (g, n) in enumerate(zip(generator, counts.tolist())):
        out[i, : int(n)] = torch.rand(int(n), generator=g)
    return out


def draw(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """(B, V) probabilities -> (B,) one token per row."""
    if isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    return torch.stack([torch.multinomial(row, 1, generator=g)[0] for row, g in zip(probs, generator)])


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 sampling probabilities at ``temperature`` (> 0)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """The chance of keeping a draft token: min(1, p(x)/q(x)) (q(x) > 0 since x was drawn from q)."""
    return torch.clamp(p_x / q_x, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim (V,); p itself where p <= q everywhere (then p == q and no rejection
    happens)."""
    rest = torch.clamp(p - q, min=0.0)
    total = rest.sum(-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp(min=1e-30), p)


def verify_sampled(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, budgets: torch.Tensor, generator: Generators
) -> tuple[torch.Tensor, torch.Tensor]:
    """B sequences at once. p (B, k+1, V) target probabilities after the context and after each draft; q (B, k, V)
    the draft's; drafts (B, k) the proposed ids, of which sequence b verifies its first budgets[b]. Returns
    (tokens (B, k+1): the accepted drafts, then the resampled or bonus token, then padding; accepted (B,))."""
    b, k = drafts.shape
    rows = torch.arange(b)
    keep = uniform(b, k, generator, budgets) < accept_probability(
        p[:, :k].gather(-1, drafts[..., None])[..., 0], q.gather(-1, drafts[..., None])[..., 0]
    )
    keep &= torch.arange(k)[None] < budgets[:, None]  # past its budget a sequence takes the bonus
    accepted = keep.long().cumprod(-1).sum(-1)  # (B,) the leading run of kept drafts
    # the first rejected position's norm(max(0, p - q)); after all budgets[b] kept, p itself (q taken as 0 there)
    q_at = torch.where((accepted < budgets)[:, None], F.pad(q, (0, 0, 0, 1))[rows, accepted], 0.0)
    last = draw(residual(p[rows, accepted], q_at), generator)  # (B,)
    tokens = torch.cat([drafts, drafts.new_zeros(b, 1)], dim=-1)
    tokens[rows, accepted] = last
    return tokens, accepted


def verify_greedy(verdict: list[int], drafts: list[int]) -> tuple[list[int], int]:
    """verdict: the target's argmax after the context and after each draft (k+1 ids). Returns the longest prefix of
    drafts equal to it, then the target's own next token, and the number of drafts kept."""
    a = 0
    while a < len(drafts) and drafts[a] == verdict[a]:
        a += 1
    return verdict[: a + 1], a


def sample(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """(B, V) probabilities -> (B,) one token each."""
    return draw(probs, generator)
