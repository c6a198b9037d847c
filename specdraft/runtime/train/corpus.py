"""A data file tokenised with the model's tokenizer and chat template: each row becomes one sample (token ids and
the mask of the tokens that carry loss). Every rank loads it before any collective, so a bad file stops every rank
with the same message (datafile.DataError, exit 2) instead of one rank dying in a collective.

The assistant mask, by template (docs/data.md, "The loss mask"):
- a chat template with `{% generation %}` markers: transformers' own `return_assistant_tokens_mask`;
- any other chat template: by prefix. For each assistant message i, the conversation up to it is rendered with the
  generation prompt (the prefix) and up to and including it; the message's tokens are those between the two
  token sequences. Each must be a token prefix of the next and of the whole conversation, else the row is refused
  (the template rewrites earlier turns, or the tokenizer merges across the boundary): add `{% generation %}`.
- no chat template: prompt/response is `tokenizer(prompt) + tokenizer(response) + [eos]`, loss on response + eos;
  `messages` needs a template. `text` is `tokenizer(text) + [eos]`, loss on every token.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import torch

from specdraft.datafile import DataError, file_sha256, problems_error, read_records, row_name
from specdraft.runtime.train import chat

GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class Sample:
    tokens: torch.Tensor  # (n,) int64
    trained: torch.Tensor  # (n,) bool: an assistant / response token (one the model is trained to produce)


@dataclass(frozen=True)
class Corpus:
    """Every sample of the file in file order, and a digest that names exactly this tokenisation."""

    samples: tuple[Sample, ...]
    digest: str  # sha256 over every sample's ids and mask
    format: str
    mask_method: str  # "generation", "prefix", "plain" (no template) or "all" (text)
    sha256: str = ""  # of the file's bytes (datafile.file_sha256): a resume compares it with the checkpoint's


def load_tokenizer(folder: str):
    """transformers' AutoTokenizer from the local model folder only (no hub)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise DataError(
            f"cannot load the tokenizer from model.path {folder}: {err}",
            "point model.path at a Hugging Face model folder with tokenizer files (tokenizer.json, "
            "tokenizer_config.json); specdraft never downloads one",
        ) from None


def chat_template(tokenizer) -> str | None:
    try:
        return tokenizer.get_chat_template()
    except ValueError:  # transformers: "Cannot use chat template functions because ... not set"
        return None


def mask_method(tokenizer, fmt: str) -> str:
    """How the samples of ``fmt`` get their loss mask with this tokenizer (the module docstring)."""
    if fmt == "text":
        return "all"
    template = chat_template(tokenizer)
    if template is None:
        return "plain"
    return "generation" if GENERATION_RE.search(template) else "prefix"


def render_messages(tokenizer, messages: list[dict], method: str) -> tuple[list[int], list[int]]:
    """(token ids, assistant mask) of one conversation through the chat template; ValueError when the template
    cannot say which tokens are the assistant's."""
    if method == "generation":
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        return list(out["input_ids"]), list(out["assistant_masks"])

    def ids(conversation, prompt=False) -> list[int]:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=prompt)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # what apply_chat_template tokenizes

    full = ids(messages)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if i == 0:
            raise ValueError(
                "the conversation opens with the assistant, and without {% generation %} markers in the chat "
                "template its tokens cannot be told apart"
            )
        before, through = ids(messages[:i], prompt=True), ids(messages[: i + 1])
        if through[: len(before)] != before or full[: len(through)] != through:
            raise ValueError(
                f"the chat template is not prefix-stable at messages[{i}] (the rendering up to it is not a token "
                "prefix of the rendering that follows); add {% generation %} markers to the template"
            )
        mask[len(before) : len(through)] = [1] * (len(through) - len(before))
    return full, mask


def encode(tokenizer, fmt: str, value, method: str) -> tuple[list[int], list[int]]:
    """(token ids, trained mask) of one record's value (datafile.Record.value) in ``fmt``."""
    eos = tokenizer.eos_token_id
    if fmt == "text":
        ids = list(tokenizer(value)["input_ids"]) + ([eos] if eos is not None else [])
        return ids, [1] * len(ids)
    if fmt in ("prompt_response", "problem_answer"):
        prompt, response = value
        if method == "plain":
            head = list(tokenizer(prompt)["input_ids"])
            tail = list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [eos]
            return head + tail, [0] * len(head) + [1] * len(tail)
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    else:
        messages = [{"role": role, "content": content} for role, content in value]
    return render_messages(tokenizer, messages, method)


def check_vocabulary(tokenizer, folder: str, vocab: int) -> None:
    """Every id the tokenizer can produce must be a row of the model's embedding: a tokenizer with more tokens than
    model.vocab_size, or one that maps any token (an added or special one) to an id at or past it, is refused by
    name before a row is read (it would train on a zero embedding and an impossible label, or fail in an index)."""
    if len(tokenizer) > vocab:
        raise DataError(
            f"the tokenizer in {folder} has {len(tokenizer):,} tokens, more than model.vocab_size ({vocab:,})",
            f"set model.vocab_size to at least {len(tokenizer):,} (the model's config.json vocab_size)",
        )
    ids = {**tokenizer.get_vocab(), **{t: i for t, i in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids)}}
    past = sorted((i, t) for t, i in ids.items() if not isinstance(i, int) or not 0 <= i < vocab)
    if past:
        i, token = past[-1]
        raise DataError(
            f"the tokenizer in {folder} maps {token!r} to id {i:,}, outside model.vocab_size ({vocab:,}); "
            f"{len(past):,} token(s) are outside it",
            "use the tokenizer the model was trained with, or set model.vocab_size above every id the tokenizer "
            "gives (the model's config.json vocab_size)",
        )


def load_corpus(plan) -> Corpus:
    """The plan's data file tokenised: DataError naming every row that cannot be trained on (too long for
    model.seq_length, no token with loss, refused by the template, a token id outside the vocabulary), any
    tokenizer that does not fit the model, and the first row whose chat template runs past its budget (chat.py)."""
    data, seq_length, vocab = plan.data, plan.model.seq_length, plan.model.vocab_size
    fmt, records = read_records(data.path, data.format)
    tokenizer = load_tokenizer(data.tokenizer)
    check_vocabulary(tokenizer, data.tokenizer, vocab)
    method = mask_method(tokenizer, fmt)
    if method == "plain" and (fmt == "messages" or tokenizer.eos_token_id is None):
        raise DataError(
            f"data file {data.path} holds {fmt}, but the tokenizer in {data.tokenizer} has no chat template"
            + ("" if fmt == "messages" else " and no eos_token"),
            "use a model folder whose tokenizer has a chat template (chat_template.jinja or tokenizer_config.json)",
        )
    field = {
        "messages": "messages",
        "prompt_response": "prompt`/`response",
        "problem_answer": "problem`/`expected_answer",
        "text": "text",
    }[fmt]
    problems: list[str] = []
    samples: list[Sample] = []
    digest = hashlib.sha256()
    templated = method in ("generation", "prefix")  # a template is code from the model folder: run under a budget
    refused_by = None
    with chat.Renderer(tokenizer) as renderer:
        for record in records:
            where = f"{row_name(data.path, record.row)}, field `{field}`"
            try:
                if templated:
                    ids, mask = renderer.call(encode, fmt, record.value, method)
                else:
                    ids, mask = encode(tokenizer, fmt, record.value, method)
            except chat.TemplateFailed as err:
                if err.over_budget:  # one row past the budget stops the file: the next would wait as long
                    raise chat.refusal(tokenizer, f"data file {data.path}, {where}", err) from None
                problems.append(f"{where}: the chat template refused it ({err.detail})")
                refused_by = chat.template_name(tokenizer)
                continue
            except (ValueError, TypeError) as err:  # the prefix rule's refusal, without a template
                problems.append(f"{where}: the tokenizer refused it ({type(err).__name__}: {err})")
                continue
            outside = [i for i in ids if not 0 <= i < vocab]
            if outside:
                problems.append(f"{where}: token id {outside[0]:,} is outside model.vocab_size ({vocab:,})")
            elif len(ids) > seq_length:
                problems.append(f"{where}: {len(ids):,} tokens, longer than model.seq_length ({seq_length:,})")
            elif sum(mask[1:]) == 0:
                problems.append(f"{where}: no token to train on (the assistant/response part is empty)")
            else:
                sample = Sample(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))
                digest.update(len(ids).to_bytes(8, "little") + sample.tokens.numpy().tobytes() + bytes(mask))
                samples.append(sample)
    if problems:
        fix = "shorten or drop those rows, or raise model.seq_length; docs/data.md says how rows are tokenised"
        if refused_by:
            fix += f"; the rows the template refused were rendered by {refused_by}"
        raise problems_error(data.path, problems, fix)
    return Corpus(
        samples=tuple(samples),
        digest=digest.hexdigest(),
        format=fmt,
        mask_method=method,
        sha256=file_sha256(data.path),
    )
