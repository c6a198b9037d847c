"""Rewards read text: built-in tasks and their prompt stream, math-verify against a prompt's answer on the decoded
response, a user's fn(prompt_text, response_text, answer, info), and every failure (raises, hangs, a non-number,
an int past the float range) a RewardError naming the prompt."""

from __future__ import annotations

import re
import sys
import types

import pytest

from specdraft.runtime.rl import rewards
from specdraft.runtime.rl.prompts import Prompt, TaskPrompts
from specdraft.runtime.rl.tasks import make_task


def _stream(name: str, seed: int = 1, per_step: int = 4) -> TaskPrompts:
    return TaskPrompts(make_task(name), seed=seed, num_per_step=per_step, vocab=16)


def _user(monkeypatch, fn):
    module = types.ModuleType("user_reward_mod")
    module.fn = fn
    monkeypatch.setitem(sys.modules, "user_reward_mod", module)
    return rewards.resolve("user_reward_mod:fn", _stream("reverse"))


def _responses(source, prompts, ids_of):
    return [rewards.Response(p, tuple(ids_of(p)), source.decode(ids_of(p))) for p in prompts]


@pytest.mark.parametrize("name", ["reverse", "arithmetic"])
def test_a_digit_task_scores_its_reference_one_and_a_wrong_answer_less(name):
    source = _stream(name, seed=5)
    prompts = source.step_prompts(2)
    assert [p.index for p in prompts] == [8, 9, 10, 11]
    assert prompts == _stream(name, seed=5).step_prompts(2)  # a pure function of the seed
    fn = rewards.resolve("task", source)
    right = rewards.score(fn, _responses(source, prompts, lambda p: p.reference), timeout_s=5)
    assert right == [1.0] * 4
    wrong = rewards.score(fn, _responses(source, prompts, lambda p: p.reference[::-1][1:] + (0,)), timeout_s=5)
    assert all(w < 1.0 for w, p in zip(wrong, prompts) if len(set(p.reference[:-1])) > 1)
    assert source.position(3) is None  # the step is the position


def test_user_rewards_get_the_texts_the_answer_and_the_ids(monkeypatch):
    seen = []
    fn = _user(monkeypatch, lambda prompt, response, answer, info: seen.append((prompt, response, answer, info)) or 0.5)
    source = _stream("arithmetic")
    (prompt,) = source.step_prompts(0)[:1]
    assert rewards.score(fn, [rewards.Response(prompt, (5, 6), "1 2")], timeout_s=5) == [0.5]
    text, response, answer, info = seen[0]
    assert text == prompt.text and re.fullmatch(r"\d \+ \d =", text)
    assert response == "1 2" and answer == prompt.answer
    assert info["response_ids"] == [5, 6] and info["prompt_ids"] == list(prompt.tokens) and info["prompt_index"] == 0


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (lambda p, r, a, i: 1 / 0, "raised ZeroDivisionError"),
        (lambda p, r, a, i: "good", "returned 'good'"),
        (lambda p, r, a, i: float("nan"), "returned nan"),
        (lambda p, r, a, i: 10**400, "an int of about 401 digits, past the float range"),
        (lambda p, r, a, i: 10**5000, "an int of about 5,001 digits, past the float range"),
        (lambda p, r, a, i: __import__("time").sleep(30), "did not return within 0.2s"),
    ],
)
def test_a_failing_reward_is_refused_naming_the_prompt(monkeypatch, fn, words):
    prompt = _stream("reverse", per_step=3).step_prompts(4)[2]
    with pytest.raises(rewards.RewardError) as err:
        rewards.score(_user(monkeypatch, fn), [rewards.Response(prompt, (5,), "1")], timeout_s=0.2)
    assert words in str(err.value) and "prompt 14" in str(err.value)


def test_a_missing_module_and_math_verify_are_refused_clearly(monkeypatch):
    with pytest.raises(rewards.RewardError, match="cannot load it"):
        rewards.resolve("no_such_module_xyz:fn", _stream("reverse"))
    monkeypatch.setattr(rewards.importlib.util, "find_spec", lambda name: None)  # an environment without it
    with pytest.raises(rewards.RewardError, match="needs the math_verify package"):
        rewards.resolve("math-verify", _stream("arithmetic"))


def test_math_verify_compares_the_decoded_text_with_the_answer():
    source = _stream("arithmetic", seed=3)
    prompts = source.step_prompts(0)
    fn = rewards.resolve("math-verify", source)
    right = _responses(source, prompts, lambda p: p.reference)
    assert rewards.score(fn, right, timeout_s=30) == [1.0] * 4
    wrong = _responses(source, prompts, lambda p: (p.reference[0] ^ 1, source.eos_id))
    assert rewards.score(fn, wrong, timeout_s=30) == [0.0] * 4


def test_math_verify_reads_the_text_not_the_ids():
    """The same ids mean what the tokenizer says: a text holding the answer scores 1 whatever its ids, and a text
    without it scores 0 even when its ids are the task's right answer."""
    fn = rewards.resolve("math-verify", _stream("arithmetic"))
    prompt = Prompt(0, 0, (1, 2), "what is 3 + 4 ?", "7", (11, 3))
    assert rewards.score(fn, [rewards.Response(prompt, (200, 201), "the answer is 7")], timeout_s=30) == [1.0]
    assert rewards.score(fn, [rewards.Response(prompt, (11, 3), "seven-ish")], timeout_s=30) == [0.0]


def test_task_rewards_need_a_built_in_task():
    class FileLike:  # a file's prompts have no verifier of their own
        pass

    with pytest.raises(rewards.RewardError, match="data.path"):
        rewards.resolve("task", FileLike())


def test_a_digit_task_reads_as_the_text_a_math_verifier_parses():
    source = _stream("arithmetic", seed=3)
    prompt = source.step_prompts(0)[0]
    assert source.decode(prompt.reference) == prompt.answer == "15"
    assert re.fullmatch(r"\d \+ \d =", prompt.text)
