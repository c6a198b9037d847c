"""Rewards read text: a response decoded with the model's tokenizer (special tokens skipped) is scored by a built-in
task's verifier (`task`), by `math-verify` against the prompt's reference answer, or by a user's `module:function`
called as fn(prompt_text, response_text, answer, info). Each call runs under a timeout, and its value is checked
inside the same guard; one that raises, hangs or returns anything but a finite number is a RewardError naming the
prompt (exit 2), not a dead job."""

from __future__ import annotations

import importlib
import importlib.util
import math
import threading
from dataclasses import dataclass
from typing import Callable

from specdraft.errors import UserError
from specdraft.runtime.rl.prompts import Prompt

# fn(prompt, response ids, response text) -> the reward's raw value
Scorer = Callable[[Prompt, tuple[int, ...], str], object]


class RewardError(UserError):
    """A reward function that cannot score a response: the message names the prompt and what went wrong."""


@dataclass(frozen=True)
class Response:
    """What is scored: the response's tokens and its text."""

    prompt: Prompt
    ids: tuple[int, ...]
    text: str


def resolve(reward: str, source) -> Scorer:
    """The scoring function grpo.reward names, over ``source``'s prompts (prompts.FilePrompts or TaskPrompts)."""
    if reward == "task":
        if not hasattr(source, "score"):
            raise RewardError(
                "grpo.reward = 'task' scores a built-in task's answers, but this run's prompts come from data.path",
                "use grpo.reward: math-verify, or your own module:function",
            )
        return lambda prompt, ids, text: source.score(prompt, ids)
    if reward == "math-verify":
        return _math_verify()
    module_name, _, name = reward.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise RewardError(
            f"grpo.reward = {reward!r}: cannot load it ({type(err).__name__}: {err})",
            "name an importable module and a function in it, as module:function (on PYTHONPATH on every node)",
        ) from None

    def call(prompt: Prompt, ids: tuple[int, ...], text: str):
        info = {
            **prompt.info,
            "prompt_index": prompt.index,
            "prompt_ids": list(prompt.tokens),
            "response_ids": list(ids),
        }
        return fn(prompt.text, text, prompt.answer, info)

    return call


def _math_verify() -> Scorer:
    if importlib.util.find_spec("math_verify") is None:
        raise RewardError(
            "grpo.reward = 'math-verify' needs the math_verify package, which is not installed",
            "pip install math-verify into the runtime's environment, or use grpo.reward: task",
        )
    from math_verify import parse, verify  # type: ignore[import-untyped]

    def score(prompt: Prompt, ids: tuple[int, ...], text: str) -> float:
        if prompt.answer is None:
            raise ValueError("the prompt has no reference answer to verify against")
        # math_verify's own timeouts use signal.alarm, which raises off the main thread; the reward runner's
        # thread already bounds each call (grpo.reward_timeout_s), so they are turned off.
        gold = parse(prompt.answer, parsing_timeout=None)
        answer = parse(text, parsing_timeout=None)
        return float(verify(gold, answer, timeout_seconds=None))

    return score


def _named(prompt: Prompt) -> str:
    where = f"prompt {prompt.index}" + (f" (row {prompt.info['row']})" if "row" in prompt.info else "")
    return f"{where}: {prompt.text[:80]!r}"


def _shown(raw: object) -> str:
    """A short echo of what a reward returned: an int of 5,000 digits has no repr, and a user's object may have a
    __repr__ that fails."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw.bit_length() > 64:
        return f"an int of about {int(raw.bit_length() * 0.30103) + 1:,} digits"
    try:
        return f"{repr(raw)[:80]} ({type(raw).__name__})"
    except Exception as err:  # a user object whose __repr__ fails: its echo says so; the refusal follows
        return f"<{type(raw).__name__}: repr failed with {type(err).__name__}>"


def _value(raw: object) -> float:
    """The reward as a float, or ValueError saying why it is none: a bool, int or float that is finite as a float
    (an int past the float range, 10**400, is refused here, not raised as OverflowError outside the guard)."""
    if not isinstance(raw, (bool, int, float)):
        raise ValueError(f"returned {_shown(raw)}")
    try:
        value = float(raw)
    except OverflowError:
        raise ValueError(f"returned {_shown(raw)}, past the float range") from None
    if not math.isfinite(value):
        raise ValueError(f"returned {value!r}")
    return value


def _call(fn: Scorer, response: Response, timeout_s: float) -> float:
    """fn on a daemon thread, its value checked there too: a hang is reported after ``timeout_s`` and never blocks
    exit; an exception or a bad value is a RewardError naming the prompt."""
    box: dict = {}

    def target():
        try:
            raw = fn(response.prompt, response.ids, response.text)
        except BaseException as err:  # reported to the caller below, with the prompt named
            box["error"] = f"raised {type(err).__name__}: {err}"
            return
        try:
            box["value"] = _value(raw)
        except ValueError as err:
            box["error"] = str(err)

    worker = threading.Thread(target=target, daemon=True, name=f"reward-{response.prompt.index}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RewardError(
            f"the reward function did not return within {timeout_s:g}s on {_named(response.prompt)}",
            "make it faster, or raise grpo.reward_timeout_s",
        )
    if "error" in box:
        raise RewardError(
            f"the reward function {box['error']} on {_named(response.prompt)}",
            "fix the reward function; it must return a finite int, float or bool for every response",
        )
    return box["value"]


def score(fn: Scorer, responses: list[Response], timeout_s: float) -> list[float]:
    """One float per response, in order."""
    return [_call(fn, r, timeout_s) for r in responses]
