"""GRPO's prompts: a user's prompt file (data.path) rendered with the checkpoint's chat template and tokenizer, or a
built-in task's seeded prompts (data.path null). Either way step s takes prompts [s * P, (s + 1) * P) of one stream,
so the stream's position is a pure function of the step; a file's stream visits every row once per epoch in a
seeded order. Each prompt carries its text, its reference answer (what rewards compare with and the SFT warm-up
trains on) and a key that names its source row across epochs (the length predictions are kept per key).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from specdraft.datafile import DataError, file_sha256, problems_error, read_records, row_name
from specdraft.plan.grpo import prompt_limit

ORDER_SEED = 0x9F7A_11ED  # the prompt order's seed namespace, apart from the data's and the tasks'
SFT_SEED = 0x5F7  # the warm-up's prompt stream, apart from the RL prompts'
GRPO_FORMATS = ("messages", "prompt_response", "problem_answer")


@dataclass(frozen=True)
class Prompt:
    index: int  # position in the run's prompt stream (step * num_prompts_per_step + i)
    key: int  # the source: a file's 1-based row, or a built-in task's prompt index
    tokens: tuple[int, ...]
    text: str  # what the model reads, as the chat template renders it
    answer: str | None  # the reference answer (rewards compare with it)
    reference: tuple[int, ...]  # the answer's tokens as the model should produce them (the SFT warm-up's labels)
    info: dict = field(default_factory=dict, compare=False)  # what a reward may use besides the answer


@dataclass(frozen=True)
class Row:
    """One tokenised row of a prompt file."""

    row: int
    tokens: tuple[int, ...]
    text: str
    answer: str
    reference: tuple[int, ...]


@dataclass(frozen=True)
class PromptFile:
    rows: tuple[Row, ...]
    digest: str  # sha256 over every row's prompt and reference tokens
    eos_id: int | None
    format: str
    sha256: str = ""  # of the file's bytes (datafile.file_sha256): a resume compares it with the checkpoint's


# ------------------------------------------------------------------------------------------------ the file
def _conversation(fmt: str, value) -> tuple[list[dict], str]:
    """(the prompt's messages, the reference answer) of a record's value (datafile.Record.value)."""
    if fmt == "messages":
        messages = [{"role": role, "content": content} for role, content in value]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return messages[:last], messages[last]["content"]
    prompt, answer = value  # prompt_response and problem_answer: one user turn and its answer
    return [{"role": "user", "content": prompt}], answer


def encode_row(tokenizer, fmt: str, value, method: str) -> tuple[list[int], str, str, list[int]]:
    """(prompt ids, prompt text, answer, reference ids) of one record. With a chat template the prompt is the
    rendering with the generation prompt, and the reference is what the template adds for the answer's turn (its
    end-of-turn tokens included); without one, the prompt's own tokens and the answer's followed by eos."""
    from specdraft.runtime.train.corpus import render_messages

    messages, answer = _conversation(fmt, value)
    if not messages:
        raise ValueError("the conversation has no turn before its last assistant message: there is no prompt")
    if method == "plain":
        prompt_ids = list(tokenizer(messages[0]["content"])["input_ids"])
        reference = list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        return prompt_ids, messages[0]["content"], answer, reference
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    full, mask = render_messages(tokenizer, [*messages, {"role": "assistant", "content": answer}], method)
    if full[: len(prompt_ids)] != prompt_ids:
        raise ValueError(
            "the chat template is not prefix-stable: the prompt with the generation prompt is not a token prefix of "
            "the conversation with its answer; add {% generation %} markers to the template"
        )
    reference = [t for t, m in zip(full[len(prompt_ids) :], mask[len(prompt_ids) :]) if m]
    return prompt_ids, text, answer, reference


def load_prompt_file(plan) -> PromptFile:
    """The plan's prompt file tokenised (every rank, before any collective; `launch` too, before any rank starts):
    DataError naming every row GRPO cannot use (its format, a template that refuses it, ids outside the vocabulary,
    or a prompt too long for model.seq_length and the engines' max_model_len with rollout.max_response_length)."""
    limit, why = prompt_limit(plan)
    return read_prompt_file(
        plan.data, vocab=plan.model.vocab_size, limit=limit, why=why, max_new=plan.grpo.max_new_tokens
    )


def read_prompt_file(data, *, vocab: int, limit: int, why: str, max_new: int) -> PromptFile:
    """``data`` (the plan's DataPlan) read and tokenised; every prompt at most ``limit`` tokens (``why``)."""
    from specdraft.runtime.train import chat
    from specdraft.runtime.train.corpus import check_vocabulary, load_tokenizer, mask_method

    fmt, records = read_records(data.path, data.format)
    if fmt not in GRPO_FORMATS:
        raise DataError(
            f"data file {data.path} holds `{fmt}` rows, which carry no prompt and answer for GRPO",
            "give GRPO rows of `messages` (the last assistant turn is the answer), `prompt`/`response`, or "
            "`problem`/`expected_answer` (docs/grpo.md)",
        )
    tokenizer = load_tokenizer(data.tokenizer)
    check_vocabulary(tokenizer, data.tokenizer, vocab)
    method = mask_method(tokenizer, fmt)
    if method == "plain" and (fmt == "messages" or tokenizer.eos_token_id is None):
        raise DataError(
            f"data file {data.path} holds {fmt}, but the tokenizer in {data.tokenizer} has no chat template"
            + ("" if fmt == "messages" else " and no eos_token"),
            "use a model folder whose tokenizer has a chat template (chat_template.jinja or tokenizer_config.json)",
        )
    field_name = {"messages": "messages", "prompt_response": "prompt", "problem_answer": "problem"}[fmt]
    problems: list[str] = []
    rows: list[Row] = []
    digest = hashlib.sha256()
    # A chat template is code from the model folder: each row renders under chat.py's time and memory budget.
    with chat.Renderer(tokenizer) as renderer:
        for record in records:
            where = f"{row_name(data.path, record.row)}, field `{field_name}`"
            try:
                if method == "plain":
                    ids, text, answer, reference = encode_row(tokenizer, fmt, record.value, method)
                else:
                    ids, text, answer, reference = renderer.call(encode_row, fmt, record.value, method)
            except chat.TemplateFailed as err:
                if err.over_budget:  # one row past the budget stops the file: the next would wait as long
                    raise chat.refusal(tokenizer, f"data file {data.path}, {where}", err) from None
                problems.append(f"{where}: the chat template refused it ({err.detail})")
                continue
            except (ValueError, TypeError) as err:  # ours: no prompt turn, a template that is not prefix-stable
                problems.append(f"{where}: {err}")
                continue
            bad = sorted({t for t in (*ids, *reference) if t is None or not 0 <= t < vocab}, key=str)
            if bad:
                problems.append(f"{where}: token ids {bad[:5]} are outside model.vocab_size ({vocab:,})")
            elif len(ids) > limit:
                problems.append(
                    f"{where}: the prompt is {len(ids):,} tokens; with rollout.max_response_length "
                    f"({max_new:,}) it must be at most {limit:,} ({why})"
                )
            else:
                rows.append(Row(record.row, tuple(ids), text, answer, tuple(reference)))
                digest.update(len(ids).to_bytes(8, "little") + torch.tensor(ids + reference).numpy().tobytes())
    if problems:
        raise problems_error(
            data.path,
            problems,
            "shorten or drop those rows, or raise model.seq_length / rollout.max_model_len; docs/grpo.md says how "
            "prompts are rendered",
        )
    return PromptFile(
        rows=tuple(rows),
        digest=digest.hexdigest(),
        eos_id=tokenizer.eos_token_id,
        format=fmt,
        sha256=file_sha256(data.path),
    )


# ------------------------------------------------------------------------------------------------ the streams
class FilePrompts:
    """A prompt file's rows as the run's prompt stream: epoch e visits every row once, in a permutation seeded by
    (seed, e) (file order with data.shuffle off); position i of the stream is row order(i // n)[i % n]."""

    name = "file"

    def __init__(self, prompts: PromptFile, tokenizer, *, seed: int, shuffle: bool, num_per_step: int, vocab: int):
        self.file, self.tokenizer, self.seed, self.shuffle = prompts, tokenizer, seed, shuffle
        self.vocab = vocab
        self.num_per_step = num_per_step
        self.eos_id = prompts.eos_id
        self.max_prompt_length = max(len(r.tokens) for r in prompts.rows)
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int, salt: int = 0) -> list[int]:
        key = epoch ^ salt
        if key not in self._orders:
            n = len(self.file.rows)
            if self.shuffle:
                g = torch.Generator().manual_seed(ORDER_SEED ^ (self.seed * 1_000_003 + epoch) ^ salt)
                self._orders[key] = torch.randperm(n, generator=g).tolist()
            else:
                self._orders[key] = list(range(n))
        return self._orders[key]

    def _at(self, position: int, salt: int = 0) -> Prompt:
        n = len(self.file.rows)
        row = self.file.rows[self.order(position // n, salt)[position % n]]
        return Prompt(position, row.row, row.tokens, row.text, row.answer, row.reference, {"row": row.row})

    def step_prompts(self, step: int) -> list[Prompt]:
        first = step * self.num_per_step
        return [self._at(first + i) for i in range(self.num_per_step)]

    def sft_prompts(self, step: int, count: int) -> list[Prompt]:
        """The warm-up's ``count`` prompts of ``step``: a stream of its own order, so RL starts on fresh rows'
        order as the run without a warm-up would."""
        return [self._at(step * count + i, SFT_SEED) for i in range(count)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def position(self, step: int) -> dict:
        """Where the stream stands before ``step`` (what metrics rows and checkpoints record)."""
        at = step * self.num_per_step
        n = len(self.file.rows)
        return {"epoch": at // n, "index": at % n, "digest": self.file.digest, "sha256": self.file.sha256}

    def restore(self, step: int, saved: dict | None) -> str | None:
        """The position is the step's; a checkpoint of other rows is named (resume refuses a changed file before
        this runs unless the user allowed it)."""
        if saved and saved.get("digest") not in (None, self.file.digest):
            return (
                f"the checkpoint was written with other prompts (digest {str(saved.get('digest'))[:12]}); the "
                f"stream continues at step {step}'s position in this file"
            )
        return None

    def label_counts(self) -> torch.Tensor:
        """(V,) how often each token is a reference label: the draft vocabulary of a reduced draft."""
        counts = torch.zeros(self.vocab, dtype=torch.int64)
        for r in self.file.rows:
            counts += torch.bincount(torch.tensor(r.reference, dtype=torch.long), minlength=self.vocab)
        return counts

    def summary(self) -> dict:
        return {"prompts": {"file_rows": len(self.file.rows), "digest": self.file.digest, "format": self.file.format}}


class TaskPrompts:
    """A built-in task's seeded prompts (runtime/rl/tasks.py), the same stream interface as FilePrompts."""

    def __init__(self, task, *, seed: int, num_per_step: int, vocab: int):
        self.task, self.seed, self.num_per_step, self.vocab = task, seed, num_per_step, vocab
        self.name = task.name
        self.eos_id = task.eos_id
        self.max_prompt_length = task.max_prompt_length

    def _prompt(self, index: int, seed: int) -> Prompt:
        p = self.task.prompt(seed, index)
        answer = p.info.get("answer")
        return Prompt(index, index, p.tokens, self.decode(p.tokens), answer, self.task.reference(p), dict(p.info))

    def step_prompts(self, step: int) -> list[Prompt]:
        first = step * self.num_per_step
        return [self._prompt(first + i, self.seed) for i in range(self.num_per_step)]

    def sft_prompts(self, step: int, count: int) -> list[Prompt]:
        return [self._prompt(step * count + i, self.seed ^ SFT_SEED) for i in range(count)]

    def decode(self, ids) -> str:
        return self.task.decode(ids)

    def score(self, prompt: Prompt, response) -> float:
        from specdraft.runtime.rl.tasks import TaskPrompt

        return self.task.score(TaskPrompt(prompt.index, prompt.tokens, prompt.info), tuple(response))

    def position(self, step: int) -> None:
        """Nothing beyond the step: a task's stream position is step * num_prompts_per_step (next_prompt)."""
        return None

    def restore(self, step: int, saved: dict | None) -> None:
        return None

    def label_counts(self) -> torch.Tensor:
        """(V,) how often each token is a reference label over the first prompts: a reduced draft's vocabulary."""
        counts = torch.zeros(self.vocab, dtype=torch.int64)
        for i in range(4096):  # the tasks' answers are short and few in kind: this many show them all
            ref = torch.tensor(self._prompt(i, self.seed).reference, dtype=torch.long)
            counts += torch.bincount(ref, minlength=self.vocab)[: self.vocab]
        return counts

    def summary(self) -> dict:
        return {"prompts": {"task": self.task.name}}


def check_row_fits(plan, source) -> None:
    """A built-in task's longest prompt + max_new_tokens must fit (a file's rows were each checked as they loaded)."""
    limit, why = prompt_limit(plan)
    if isinstance(source, TaskPrompts) and source.max_prompt_length > limit:
        raise DataError(
            f"grpo.task {source.name!r} has prompts of up to {source.max_prompt_length} tokens; with "
            f"rollout.max_response_length ({plan.grpo.max_new_tokens}) they must be at most {limit} ({why})",
            "raise model.seq_length (and rollout.max_model_len), or lower rollout.max_response_length",
        )
