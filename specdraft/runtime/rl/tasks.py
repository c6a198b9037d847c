"""Built-in verifiable tasks, generated from the seed (no download): each gives prompts, a reference answer for the
SFT warm-up and a 0-1 reward for a response.

Token ids: 0 pad, 1 bos, 2 sep, 3 eos, 4-13 the digits 0-9, 14 '+'; `markov` uses the whole vocabulary instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PAD, BOS, SEP, EOS, DIGIT0, PLUS = 0, 1, 2, 3, 4, 14
MIN_VOCAB = 16  # the digit tasks' ids fit a vocabulary of this size
TASK_SEED = 0x7A5C  # the tasks' prompt seed namespace, apart from the data's and the weights'


@dataclass(frozen=True)
class TaskPrompt:
    index: int  # global prompt number in the stream (step * num_prompts_per_step + i)
    tokens: tuple[int, ...]
    info: dict = field(default_factory=dict, compare=False)  # what the verifier needs (e.g. the answer)


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(TASK_SEED ^ (seed * 1_000_003 + index))


class ReverseTask:
    """Reverse a list of 3-5 digits; reward = the fraction of the list's positions answered right."""

    name, eos_id, max_answer, max_prompt_length = "reverse", EOS, 6, 7

    def prompt(self, seed: int, index: int) -> TaskPrompt:
        g = _generator(seed, index)
        n = int(torch.randint(3, 6, (1,), generator=g))
        digits = torch.randint(0, 10, (n,), generator=g).tolist()
        tokens = (BOS, *(DIGIT0 + d for d in digits), SEP)
        return TaskPrompt(index, tokens, {"answer": " ".join(str(d) for d in reversed(digits))})

    def reference(self, prompt: TaskPrompt) -> tuple[int, ...]:
        return (*reversed(prompt.tokens[1:-1]), EOS)

    def decode(self, tokens) -> str:
        return detokenize(tokens)

    def score(self, prompt: TaskPrompt, response: tuple[int, ...]) -> float:
        want = self.reference(prompt)[:-1]
        return sum(int(a == b) for a, b in zip(response, want)) / len(want)


class ArithmeticTask:
    """a + b for digits a, b; reward 1 for the exact sum's digits then eos, else 0."""

    name, eos_id, max_answer, max_prompt_length = "arithmetic", EOS, 3, 5

    def prompt(self, seed: int, index: int) -> TaskPrompt:
        a, b = torch.randint(0, 10, (2,), generator=_generator(seed, index)).tolist()
        return TaskPrompt(index, (BOS, DIGIT0 + a, PLUS, DIGIT0 + b, SEP), {"answer": str(a + b)})

    def reference(self, prompt: TaskPrompt) -> tuple[int, ...]:
        return (*(DIGIT0 + int(c) for c in prompt.info["answer"]), EOS)

    def decode(self, tokens) -> str:
        return detokenize(tokens)

    def score(self, prompt: TaskPrompt, response: tuple[int, ...]) -> float:
        return float(tuple(response) == self.reference(prompt))


class MarkovTask:
    """Continue the run's seeded Markov chain (data.py); reward = the fraction of generated tokens that are the
    chain's most likely successor of the token before them. Responses run to max_new_tokens (no eos)."""

    name, eos_id = "markov", None
    PROMPT_LENGTH = max_prompt_length = 8

    def __init__(self, chain, max_new_tokens: int):
        self.chain, self.max_answer = chain, max_new_tokens  # chain: data.MarkovData of the run

    def prompt(self, seed: int, index: int) -> TaskPrompt:
        return TaskPrompt(index, tuple(self.chain.prompt(0, index, self.PROMPT_LENGTH).tolist()))

    def reference(self, prompt: TaskPrompt) -> tuple[int, ...]:
        g = _generator(self.chain.seed, prompt.index)
        out, last = [], prompt.tokens[-1]
        picks = torch.multinomial(self.chain.probs, self.max_answer, replacement=True, generator=g).tolist()
        for pick in picks:
            last = int(self.chain.successors[last, pick])
            out.append(last)
        return tuple(out)

    def decode(self, tokens) -> str:
        """The chain's tokens have no text: their ids, as the recorded text."""
        return " ".join(str(int(t)) for t in tokens)

    def score(self, prompt: TaskPrompt, response: tuple[int, ...]) -> float:
        if not response:
            return 0.0
        previous = (prompt.tokens[-1], *response[:-1])
        top = self.chain.successors[:, 0]
        return sum(int(int(top[a]) == b) for a, b in zip(previous, response)) / len(response)


DIGIT_TASKS = {"reverse": ReverseTask, "arithmetic": ArithmeticTask}
TASKS = (*DIGIT_TASKS, "markov")


def make_task(name: str, *, chain=None, max_new_tokens: int = 16):
    """The task called ``name``; ``chain`` (data.MarkovData) is the markov task's chain."""
    if name == "markov":
        return MarkovTask(chain, max_new_tokens)
    return DIGIT_TASKS[name]()


def detokenize(tokens) -> str:
    """Text of a digit task's tokens, its own tokenizer (what a reward reads). Its special tokens are skipped, as a
    tokenizer's decode(skip_special_tokens=True) skips them; an id outside the task's tokens reads as <id>."""
    names = {PAD: "", BOS: "", SEP: " = ", EOS: "", PLUS: " + "}  # a number's digits run together: one number
    text = "".join(names.get(t, str(t - DIGIT0) if DIGIT0 <= t < DIGIT0 + 10 else f" <{t}> ") for t in tokens)
    return " ".join(text.split())
