"""GRPO's algorithm values as NeMo-RL keys (grpo.* and loss_fn.*), from plain values: the render passes what the
plan holds, and a plan section with NeMo-RL's GRPO names maps through the same function."""

from __future__ import annotations

from typing import Optional


def grpo_keys(
    *,
    num_prompts_per_step: int,
    num_generations_per_prompt: int,
    ratio_clip_min: Optional[float] = None,
    ratio_clip_max: Optional[float] = None,
    reference_policy_kl_penalty: Optional[float] = None,
) -> dict:
    """{"grpo": ..., "loss_fn": ...} with each given value under its NeMo-RL key (examples/configs/grpo_math_1B.yaml);
    a value left None keeps the base config's, and an empty loss_fn is left out."""
    loss_fn = {
        key: value
        for key, value in (
            ("ratio_clip_min", ratio_clip_min),
            ("ratio_clip_max", ratio_clip_max),
            ("reference_policy_kl_penalty", reference_policy_kl_penalty),
        )
        if value is not None
    }
    out: dict = {
        "grpo": {"num_prompts_per_step": num_prompts_per_step, "num_generations_per_prompt": num_generations_per_prompt}
    }
    if loss_fn:
        out["loss_fn"] = loss_fn
    return out


def merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in, nested dicts key by key (extra wins), in base's key order then extra's."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
