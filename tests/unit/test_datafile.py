"""A data file's rows, checked before any rank starts (specdraft/datafile.py, no torch): every bad file gets one
message naming the file, the row (1-based line of a jsonl, row of a parquet) and the field, listing every problem at
once; `specdraft validate` and `specdraft launch` (a dry run too) refuse it with exit 2 and no traceback.

Cases: a missing field, an empty file, a wrong type, a row that is not an object, lines that are not JSON (a binary
file), a parquet file that is not one, a folder or a FIFO in the file's place, a missing file, no assistant message,
no known field at all, and a tokenizer folder without tokenizer files. Good files in each format, jsonl and parquet,
read back as the records the runtime tokenises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.datafile import MAX_LISTED, DataError, check_file, read_records
from tests.support.hf_tokenizer import write_jsonl, write_parquet

SPECDRAFT = str(Path(sys.executable).parent / "specdraft")
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _error(path, fmt="auto") -> str:
    with pytest.raises(DataError) as err:
        read_records(str(path), fmt)
    return str(err.value)


def test_good_files_in_every_format(tmp_path):
    rows = [{"messages": CHAT}, {"messages": CHAT + CHAT, "id": 7}]
    for path in (write_jsonl(tmp_path / "a.jsonl", rows), write_parquet(tmp_path / "a.parquet", rows)):
        fmt, records = read_records(str(path))
        assert fmt == "messages" and [r.row for r in records] == [1, 2]
        assert records[0].value == (("user", "hi"), ("assistant", "hello"))
    fmt, records = read_records(str(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "response": "a"}])))
    assert fmt == "prompt_response" and records[0].value == ("q", "a")
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n', encoding="utf-8")  # a blank line holds no row
    fmt, records = read_records(str(path))
    assert fmt == "text" and [(r.row, r.value) for r in records] == [(1, "one"), (3, "two")]


def test_missing_fields_and_wrong_types_are_named_by_line_and_field(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {"messages": CHAT},
            {"messages": [{"role": "user", "content": 3}, {"content": "x"}]},
            {"prompt": "no messages"},
            {"messages": "hello"},
            [1, 2],
            {"messages": [{"role": "user", "content": "no reply"}]},
        ],
    )
    message = _error(path)
    assert message.startswith(f"data file {path}: 6 problems:")
    for part in (
        "line 2, field `messages[0].content`: must be a string, got a number 3",
        "line 2, field `messages[1].role`: is missing",
        "line 3, field `messages`: is missing",
        "line 4, field `messages`: must be a list of {role, content}, got a str",
        "line 5: must be a JSON object with the row's fields, got a list",
        "line 6, field `messages`: has no message with role 'assistant'",
    ):
        assert part in message, part
    assert "line 1" not in message
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "response": None}, {"prompt": 1, "response": "a"}])
    message = _error(pairs, "prompt_response")
    assert "line 1, field `response`: must be a string, got null" in message
    assert "line 2, field `prompt`: must be a string, got a number 1" in message


def test_parquet_rows_are_named_by_row(tmp_path):
    path = write_parquet(
        tmp_path / "bad.parquet", [{"prompt": "q", "response": "a"}, {"prompt": "q", "response": None}]
    )
    assert "row 2, field `response`: must be a string, got null" in _error(path)


def test_empty_unreadable_and_foreign_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert f"data file {empty} has no rows" in _error(empty)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x00\x01\x80\x81" * 64 + b"\n" + b'{"text": 1\n' + b"not json\n" * 30)
    message = _error(binary)
    assert message.startswith(f"data file {binary}: 32 problems:")
    assert "line 1: is not UTF-8 text (byte 2)" in message and "line 2: is not JSON (Expecting ',' delimiter" in message
    assert f"... and {32 - MAX_LISTED} more" in message, "every problem counted, the first ones listed"
    fake = tmp_path / "fake.parquet"
    fake.write_text('{"text": "json, not parquet"}\n')
    assert f"data file {fake} is not a readable parquet file" in _error(fake)
    assert f"data file {tmp_path / 'nope.jsonl'} does not exist" in _error(tmp_path / "nope.jsonl")
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    assert "is a directory, not a regular file" in _error(folder)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a regular file" in _error(fifo), "refused, never waited on"
    unknown = write_jsonl(tmp_path / "unknown.jsonl", [{"question": "q", "answer": "a"}])
    assert "line 1: has none of the fields `messages`, `prompt`/`response`, `problem`/`expected_answer`" in (
        _error(unknown)
    )


def test_the_tokenizer_folder_needs_tokenizer_files(tmp_path):
    data = str(write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}]))
    with pytest.raises(DataError, match="is not a folder"):
        check_file(data, "auto", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="has no tokenizer files"):
        check_file(data, "auto", str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert check_file(data, "auto", str(tmp_path)) == ("text", 1)


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "SPECDRAFT_DEBUG"}
    return subprocess.run([SPECDRAFT, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def test_validate_and_launch_refuse_a_bad_file_before_any_rank_starts(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    good = write_jsonl(tmp_path / "good.jsonl", [{"messages": CHAT}] * 3)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": CHAT}, {"messages": [{"role": "assistant"}]}])
    common = [f"model.path={tmp_path / 'model'}"]
    ok = _cli("validate", f"data.path={good}", *common)
    assert ok.returncode == 0, ok.stderr
    assert f"data: {good}: 3 rows of messages" in ok.stdout
    for command in (["validate"], ["launch", "--dry-run", "--run-dir", tmp_path / "run"]):
        out = _cli(*command, f"data.path={bad}", *common)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert (
            f"data file {bad}: 1 problem" in out.stderr
            and "line 2, field `messages[0].content`: is missing" in out.stderr
        )
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
    rel = _cli("validate", "data.path=good.jsonl", *common)
    assert rel.returncode == 2 and "data.path = 'good.jsonl': must be an absolute path" in rel.stderr
    assert json.loads(_cli("plan", f"data.path={good}", *common, "--format", "json").stdout)["data"]["path"] == str(
        good
    )
