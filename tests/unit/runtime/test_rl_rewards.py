"""Built-in tasks, the prompt stream and reward failures: a reward that raises, hangs or returns a non-number is a
RewardError naming the prompt."""

from __future__ import annotations

import re
import sys
import types
from types import SimpleNamespace

import pytest

from specdraft.runtime.rl import rewards
from specdraft.runtime.rl.prompts import PromptStream
from specdraft.runtime.rl.tasks import make_task


def _user(monkeypatch, fn):
    module = types.ModuleType("user_reward_mod")
    module.fn = fn
    monkeypatch.setitem(sys.modules, "user_reward_mod", module)
    return rewards.resolve("user_reward_mod:fn", make_task("reverse"))


@pytest.mark.parametrize("name", ["reverse", "arithmetic"])
def test_a_digit_task_scores_its_reference_one_and_a_wrong_answer_less(name):
    task = make_task(name)
    stream = PromptStream(task, seed=5, num_per_step=4)
    prompts = stream.step_prompts(2)
    assert [p.index for p in prompts] == [8, 9, 10, 11]
    assert prompts == PromptStream(task, seed=5, num_per_step=4).step_prompts(2)  # a pure function of the seed
    for p in prompts:
        answer = task.reference(p)
        assert task.score(p, answer) == 1.0
        assert task.score(p, tuple(answer[::-1][1:]) + (0,)) < 1.0 or len(set(answer[:-1])) == 1
    assert stream.next_prompt(3) == 12 and stream.position(3) is None  # the checkpoint's step is the position


def test_user_rewards_are_called_with_plain_lists(monkeypatch):
    seen = []
    fn = _user(monkeypatch, lambda prompt, response, info: seen.append((prompt, response, info)) or 0.5)
    prompts = PromptStream(make_task("reverse"), seed=1, num_per_step=1).step_prompts(0)
    assert rewards.score(fn, prompts, [SimpleNamespace(prompt_index=0, response=(5, 6))], timeout_s=5) == [0.5]
    assert seen[0][1] == [5, 6] and isinstance(seen[0][0], list) and "answer" in seen[0][2]


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (lambda p, r, i: 1 / 0, "raised ZeroDivisionError"),
        (lambda p, r, i: "good", "returned 'good'"),
        (lambda p, r, i: float("nan"), "returned nan"),
        (lambda p, r, i: 10**400, "returned an integer of about 401 digits (int)"),  # past float: not an OverflowError
        (lambda p, r, i: -(10**5000), "returned an integer of about 5,001 digits (int)"),  # no repr past 4,300 digits
        (lambda p, r, i: __import__("time").sleep(30), "did not return within 0.2s"),
    ],
)
def test_a_failing_reward_is_refused_naming_the_prompt(monkeypatch, fn, words):
    prompts = PromptStream(make_task("reverse"), seed=1, num_per_step=3).step_prompts(4)
    with pytest.raises(rewards.RewardError) as err:
        rewards.score(_user(monkeypatch, fn), prompts, [SimpleNamespace(prompt_index=2, response=(5,))], timeout_s=0.2)
    assert words in str(err.value) and "prompt 14" in str(err.value)


def test_a_missing_module_and_math_verify_are_refused_clearly(monkeypatch):
    with pytest.raises(rewards.RewardError, match="cannot load it"):
        rewards.resolve("no_such_module_xyz:fn", make_task("reverse"))
    monkeypatch.setattr(rewards.importlib.util, "find_spec", lambda name: None)  # an environment without it
    with pytest.raises(rewards.RewardError, match="needs the math_verify package"):
        rewards.resolve("math-verify", make_task("arithmetic"))


def test_math_verify_scores_the_arithmetic_answers_on_the_reward_thread():
    task = make_task("arithmetic")
    prompts = PromptStream(task, seed=3, num_per_step=4).step_prompts(0)
    right = [SimpleNamespace(prompt_index=i, response=task.reference(p)) for i, p in enumerate(prompts)]
    wrong = [
        SimpleNamespace(prompt_index=i, response=(task.reference(p)[0] ^ 1, task.eos_id)) for i, p in enumerate(prompts)
    ]
    fn = rewards.resolve("math-verify", task)
    assert rewards.score(fn, prompts, right, timeout_s=30) == [1.0] * 4
    assert rewards.score(fn, prompts, wrong, timeout_s=30) == [0.0] * 4


def test_a_digit_task_reads_as_the_text_a_math_verifier_parses():
    task = make_task("arithmetic")
    prompt = PromptStream(task, seed=3, num_per_step=1).step_prompts(0)[0]
    assert rewards.detokenize(task.reference(prompt)) == prompt.info["answer"] == "15"
    assert re.fullmatch(r"\d \+ \d =", rewards.detokenize(prompt.tokens))
