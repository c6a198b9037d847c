"""The GRPO metrics.jsonl fields that measure time, and rows without them: what the resume tests compare."""

from __future__ import annotations

TIMING = ("step_time_s", "draft_time_s", "generate_s", "score_s", "train_s", "refit_s", "policy_refit_s")
TIMING += ("draft_refit_s", "tokens_per_s")


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]
