"""Group-normalised advantages (GRPO): each response's reward against the other responses to the same prompt.

As NeMo-RL's grpo.py: baseline = the group's mean reward (or, with use_leave_one_out_baseline, the mean of the
other G-1), advantage = reward - baseline, divided by the group's std (unbiased, torch.std's default) + 1e-6 when
normalize_rewards is on. A group whose rewards are all equal has advantage 0 everywhere.
"""

from __future__ import annotations

import torch

STD_EPS = 1e-6


def group_advantages(
    rewards: torch.Tensor, num_generations: int, *, normalize: bool = True, leave_one_out: bool = False
) -> torch.Tensor:
    """(n,) float64 advantages of ``rewards`` (n,), laid out prompt-major: rows [i*G, (i+1)*G) share prompt i."""
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {num_generations}")
    groups = rewards.to(torch.float64).reshape(-1, num_generations)  # (P, G)
    if leave_one_out and num_generations > 1:
        baseline = (groups.sum(1, keepdim=True) - groups) / (num_generations - 1)
    else:
        baseline = groups.mean(1, keepdim=True)
    out = groups - baseline
    if normalize and num_generations > 1:
        std = groups.std(1, keepdim=True)
        out = torch.where(std > 0, out / (std + STD_EPS), torch.zeros_like(out))
    return out.reshape(-1)
