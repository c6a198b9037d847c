"""User reward functions (`module:function`) for tests/dist/test_grpo.py."""

from __future__ import annotations


def fails_on_prompt_3(prompt: list[int], response: list[int], info: dict) -> float:
    if info["prompt_index"] == 3:
        raise RuntimeError("this reward refuses prompt 3")
    return 0.0
