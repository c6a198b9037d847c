"""NeMo-RL's ClippedPGLossFn per token, summed over response tokens and normalised by the global response-token
count (a token-level mean over the whole step, the same in every layout).

Per token: r = exp(logp - old_logp); pg = max(-A r, -A clamp(r, 1 - ratio_clip_min, 1 + ratio_clip_max)); with a
reference policy the k3 estimator kl = exp(ref - logp) - (ref - logp) - 1 (Schulman's "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html) weighted by reference_policy_kl_penalty is added.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ClipSettings:
    ratio_clip_min: float
    ratio_clip_max: float
    kl_penalty: float  # reference_policy_kl_penalty; 0 = no reference policy


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) from the sampled tokens' log-probs."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1


def token_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    ref_logp: torch.Tensor | None,
    settings: ClipSettings,
) -> dict[str, torch.Tensor]:
    """Per-token tensors: `pg` (the clipped policy-gradient loss), `kl` (unweighted k3, 0 without a reference),
    `clipped` (1 where the clamped ratio was the max, i.e. the clip took effect) and `ratio`."""
    ratio = torch.exp(logp - old_logp)
    clamped = ratio.clamp(1 - settings.ratio_clip_min, 1 + settings.ratio_clip_max)
    loss1, loss2 = -advantages * ratio, -advantages * clamped
    pg = torch.maximum(loss1, loss2)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None and settings.kl_penalty else torch.zeros_like(logp)
    return {"pg": pg, "kl": kl, "clipped": (loss2 > loss1).to(logp.dtype), "ratio": ratio.detach()}


def clipped_pg_sums(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    settings: ClipSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss sum over masked tokens, detached sums of pg, kl and clipped) -- divide by the global token count."""
    terms = token_terms(logp, old_logp, advantages, ref_logp, settings)
    pg_sum = (terms["pg"] * mask).sum()
    kl_sum = (terms["kl"] * mask).sum()
    total = pg_sum + settings.kl_penalty * kl_sum
    sums = {"pg": pg_sum.detach(), "kl": kl_sum.detach(), "clipped": (terms["clipped"] * mask).sum().detach()}
    return total, sums
