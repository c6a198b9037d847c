"""The GRPO metrics.jsonl fields that measure time, and rows without them: what the resume tests compare."""

from __future__ import annotations

TIMING = ("step_time_s", "draft_time_s", "generate_s", "score_s", "exchange_s", "logprobs_s", "update_s", "train_s")
TIMING += ("refit_s", "policy_refit_s", "draft_refit_s", "tokens_per_s", "busy_s", "idle_s")


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def without_timing(rows: list[dict]) -> list[dict]:
    """``rows`` without any field that measures time, the per-instance figures' included."""
    return [_strip(row) for row in rows]
