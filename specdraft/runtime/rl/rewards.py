"""Rewards: the task's verifier, `math-verify` or a user's `module:function` (fn(prompt_ids, response_ids, info) ->
float, info = the task's facts + "prompt_index"), each call under a timeout; one that raises, hangs or returns a
non-number is a RewardError naming the prompt (exit 2), not a dead job."""

from __future__ import annotations

import importlib
import importlib.util
import math
import threading
from dataclasses import dataclass
from typing import Callable

from specdraft.errors import UserError
from specdraft.runtime.rl.tasks import Prompt, detokenize


class RewardError(UserError):
    """A reward function that cannot score a response: the message names the prompt and what went wrong."""


@dataclass(frozen=True)
class Scored:
    rewards: list[float]
    seconds: float


def resolve(reward: str, task) -> Callable[[Prompt, tuple[int, ...]], float]:
    """The scoring function the spec's grpo.reward names, on ``task``'s prompts."""
    if reward == "task":
        return task.score
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

    def call(prompt: Prompt, response: tuple[int, ...]):
        return fn(list(prompt.tokens), list(response), {**prompt.info, "prompt_index": prompt.index})

    return call


def _math_verify() -> Callable[[Prompt, tuple[int, ...]], float]:
    if importlib.util.find_spec("math_verify") is None:
        raise RewardError(
            "grpo.reward = 'math-verify' needs the math_verify package, which is not installed",
            "pip install math-verify into the runtime's environment, or use grpo.reward: task",
        )
    from math_verify import parse, verify  # type: ignore[import-untyped]

    def score(prompt: Prompt, response: tuple[int, ...]) -> float:
        # math_verify's own timeouts use signal.alarm, which raises off the main thread; the reward runner's
        # thread already bounds each call (grpo.reward_timeout_s), so they are turned off.
        gold = parse(prompt.info["answer"], parsing_timeout=None)
        answer = parse(detokenize(response), parsing_timeout=None)
        return float(verify(gold, answer, timeout_seconds=None))

    return score


def _call(fn, prompt: Prompt, response: tuple[int, ...], timeout_s: float) -> float:
    """fn(prompt, response) on a daemon thread, its value checked there too (a number, finite as a float): a hang is
    reported after ``timeout_s`` and never blocks exit; anything else wrong is a RewardError naming the prompt."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(prompt, response)
            box["reward"] = _finite(box["value"])
        except BaseException as err:  # reported to the caller below, with the prompt named
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True, name=f"reward-{prompt.index}")
    worker.start()
    worker.join(timeout_s)
    where = f"on prompt {prompt.index} (tokens {list(prompt.tokens)[:32]})"
    if worker.is_alive():
        raise RewardError(
            f"the reward function did not return within {timeout_s:g}s {where}",
            "make it faster, or raise grpo.reward_timeout_s",
        )
    if "value" in box and "reward" not in box:
        value = box["value"]
        raise RewardError(
            f"the reward function returned {_shown(value)} ({type(value).__name__}) {where}",
            "return a finite int, float or bool",
        )
    if "error" in box:
        err = box["error"]
        raise RewardError(
            f"the reward function raised {type(err).__name__}: {str(err)[:1000]} {where}",
            "fix the reward function; it must return a number for every response",
        )
    return box["reward"]


def _finite(value) -> float:
    """``value`` as the float a reward is: a bool, int or float that is finite as a float (10**400 is not)."""
    if not isinstance(value, (bool, int, float)):
        raise TypeError("not a number")
    out = float(value)  # OverflowError for an int past float's range
    if not math.isfinite(out):
        raise ValueError("not finite")
    return out


def _shown(value) -> str:
    """A short echo of what a reward returned (an int of 5,000 digits has no repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        return repr(value)[:200]
    except Exception as err:  # a user object whose __repr__ fails: say so, not a traceback
        return f"<{type(value).__name__}: repr failed with {type(err).__name__}>"


def score(fn, prompts: list[Prompt], rollouts, timeout_s: float) -> list[float]:
    """One float per rollout (rollout.prompt_index indexes ``prompts``); every value is checked inside the guarded
    call (_call): a non-number or one not finite as a float is a RewardError naming the prompt."""
    return [_call(fn, prompts[r.prompt_index], tuple(r.response), timeout_s) for r in rollouts]
