"""User reward functions (`module:function`, called as fn(prompt_text, response_text, answer, info)) for
tests/dist/test_grpo.py."""

from __future__ import annotations


def fails_on_prompt_3(prompt: str, response: str, answer: str | None, info: dict) -> float:
    if info["prompt_index"] == 3:
        raise RuntimeError("this reward refuses prompt 3")
    return 0.0


def answer_in_text(prompt: str, response: str, answer: str | None, info: dict) -> float:
    """1 when the reference answer appears in the response text."""
    return float(answer is not None and answer in response)
