"""GRPO's prompt files (runtime/rl/prompts.py) with a real tokenizer and chat template: every row format renders its
prompt as the template does with the generation prompt, the reference is the answer's turn, rows that cannot be used
are refused naming the file, the row and the field, and the stream visits every row once per seeded epoch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdraft.datafile import DataError
from specdraft.runtime.rl.prompts import FilePrompts, read_prompt_file
from tests.support import grpo_user, hf_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf_tokenizer.make_model_folder(tmp_path_factory.mktemp("tok") / "model")


def _data(path, fmt="auto", tokenizer=None, shuffle=True, seed=3):
    return SimpleNamespace(path=str(path), format=fmt, tokenizer=str(tokenizer), shuffle=shuffle, seed=seed)


def _read(path, folder, limit=200, **kw):
    return read_prompt_file(_data(path, tokenizer=folder, **kw), vocab=hf_tokenizer.VOCAB_SIZE, limit=limit,
                            why="model.seq_length", max_new=8)  # fmt: skip


@pytest.mark.parametrize("fmt", ["problem_answer", "prompt_response", "messages"])
def test_every_row_format_renders_its_prompt_with_the_chat_template(folder, tmp_path, fmt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    path = grpo_user.write_prompts(tmp_path / "p.jsonl", n=6, fmt=fmt)
    found = _read(path, folder)
    assert found.format == fmt and len(found.rows) == 6
    for row, (question, answer) in zip(found.rows, grpo_user.problems(6)):
        messages = [{"role": "user", "content": question}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert row.text == text and row.answer == answer
        assert list(row.tokens) == tok(text, add_special_tokens=False)["input_ids"]
        # the reference is the answer's turn as the template closes it
        assert tok.decode(row.reference) == answer + "<|eot_id|>"


def test_a_multi_turn_conversation_keeps_its_earlier_turns_in_the_prompt(folder, tmp_path):
    from transformers import AutoTokenizer

    turns = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hello world"},
        {"role": "user", "content": "what is 2 + 2 ?"},
        {"role": "assistant", "content": "4"},
    ]
    path = hf_tokenizer.write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns}])
    (row,) = _read(path, folder).rows
    tok = AutoTokenizer.from_pretrained(folder)
    assert row.text == tok.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
    assert row.answer == "4"


def test_rows_grpo_cannot_use_are_refused_by_file_row_and_field(folder, tmp_path):
    long = "what is " + " + ".join(["1"] * 80) + " ?"
    rows = [{"problem": "what is 1 + 1 ?", "expected_answer": "2"}, {"problem": long, "expected_answer": "80"}]
    path = hf_tokenizer.write_jsonl(tmp_path / "long.jsonl", rows)
    with pytest.raises(DataError) as err:
        _read(path, folder, limit=40)
    text = str(err.value)
    assert str(path) in text and "line 2, field `problem`" in text and "at most 40" in text and "line 1" not in text
    texts = hf_tokenizer.write_jsonl(tmp_path / "text.jsonl", [{"text": "the cat runs"}])
    with pytest.raises(DataError, match="carry no prompt and answer for GRPO"):
        _read(texts, folder)


def test_a_numeric_expected_answer_reads_as_its_text(folder, tmp_path):
    path = hf_tokenizer.write_jsonl(tmp_path / "n.jsonl", [{"problem": "what is 3 + 4 ?", "expected_answer": 7}])
    assert _read(path, folder).rows[0].answer == "7"


def test_the_stream_visits_every_row_once_per_seeded_epoch(folder, tmp_path):
    from transformers import AutoTokenizer

    path = grpo_user.write_prompts(tmp_path / "p.jsonl", n=10)
    found = _read(path, folder)
    tok = AutoTokenizer.from_pretrained(folder)

    def stream(seed=3, shuffle=True):
        return FilePrompts(found, tok, seed=seed, shuffle=shuffle, num_per_step=4, vocab=hf_tokenizer.VOCAB_SIZE)

    s = stream()
    keys = [p.key for step in range(5) for p in s.step_prompts(step)]  # 20 positions: epochs 0 and 1
    assert sorted(keys[:10]) == sorted(keys[10:]) == list(range(1, 11)) and keys[:10] != keys[10:]
    assert [p.index for p in s.step_prompts(2)] == [8, 9, 10, 11]
    assert keys == [p.key for step in range(5) for p in stream().step_prompts(step)]  # seeded
    assert keys != [p.key for step in range(5) for p in stream(seed=4).step_prompts(step)]
    assert [p.key for p in stream(shuffle=False).step_prompts(0)] == [1, 2, 3, 4]  # the file's order
    assert s.position(3) == {"epoch": 1, "index": 2, "digest": found.digest, "sha256": found.sha256}
    assert len(found.sha256) == 64
    sft = [p.key for p in s.sft_prompts(0, 10)]
    assert sorted(sft) == list(range(1, 11)) and sft != keys[:10]  # its own order
    assert s.decode(found.rows[0].reference) == found.rows[0].answer  # special tokens skipped
