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


def _call(fn, prompt: Prompt, response: tuple[int, ...], timeout_s: float):
    """fn(prompt, response) on a daemon thread: a hang is reported after ``timeout_s`` and never blocks exit."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(prompt, response)
        except BaseException as err:  # reported to the caller below, with the prompt named
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True, name=f"reward-{prompt.index}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RewardError(
            f"the reward function did not return within {timeout_s:g}s on prompt {prompt.index} "
            f"(tokens {list(prompt.tokens)[:32]})",
            "make it faster, or raise grpo.reward_timeout_s",
        )
    if "error" in box:
        err = box["error"]
        raise RewardError(
            f"the reward function raised {type(err).__name__}: {err} on prompt {prompt.index} "
            f"(tokens {list(prompt.tokens)[:32]})",
            "fix the reward function; it must return a number for every response",
        )
    return box["value"]


def score(fn, prompts: list[Prompt], rollouts, timeout_s: float) -> list[float]:
    """One float per rollout (rollout.prompt_index indexes ``prompts``); a non-number or non-finite value is a
    RewardError naming the prompt."""
    out = []
    for r in rollouts:
        prompt = prompts[r.prompt_index]
        value = _call(fn, prompt, tuple(r.response), timeout_s)
        if not isinstance(value, (bool, int, float)) or not math.isfinite(float(value)):
            raise RewardError(
                f"the reward function returned {value!r} ({type(value).__name__}) on prompt {prompt.index} "
                f"(tokens {list(prompt.tokens)[:32]})",
                "return a finite int, float or bool",
            )
        out.append(float(value))
    return out
