"""Fuzzing the JSON specdraft reads from folders it did not write, the way test_fuzz_run_files.py fuzzes run files:
a model's config.json, a safetensors header and its shard index, an EAGLE-3 draft's config.json and the rows of a
data file, each a good file mutated (a field replaced or deleted, cut short, a byte changed, a 5,000-digit integer,
100,000-deep nesting, NaN). Whatever they hold, each reader ends in its value or a clean refusal (a SpecdraftError
naming the file), and `specdraft validate` through the CLI's one error boundary ends in exit 0 or 2, never in an
internal error.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft import datafile, eagle3_checkpoint
from specdraft.assemble import compile
from specdraft.errors import SpecdraftError
from specdraft.plan.draft_checkpoint import expected
from specdraft.runtime.models.hf import checkpoint as hf
from specdraft.spec.checkpoints import hf_config
from specdraft.spec.load import load_layout
from tests.support.cli import run_cli
from tests.support.json_fuzz import mutated
from tests.support.model_files import DRAFT, HEADER, INDEX, LLAMA, write_safetensors

FUZZ = settings(
    max_examples=int(os.environ.get("SPECDRAFT_FUZZ_EXAMPLES", "60")),
    deadline=timedelta(seconds=20),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "id": 7}


def _clean(call):
    """The reader's value, or None after a clean refusal: anything but a SpecdraftError fails the test."""
    try:
        return call()
    except SpecdraftError:
        return None


def _cli_clean(*args) -> int:
    got = run_cli(*args)
    text = got.stdout + got.stderr
    assert got.returncode in (0, 2), text[-2000:]
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    return got.returncode


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    for name, keep in (("s1.safetensors", "a"), ("s2.safetensors", "b")):
        size = 24 if keep == "a" else 32
        entry = {**HEADER[keep], "data_offsets": [0, size]}
        write_safetensors(folder / name, json.dumps({keep: entry}).encode(), bytes(size))
    return folder


@FUZZ
@given(data=st.data())
def test_random_model_configs(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_bytes(data.draw(mutated(json.dumps(LLAMA).encode())))
    _clean(lambda: hf_config.read({"model": {"path": str(folder)}}, "fuzz.yaml"))
    config = _clean(lambda: hf.read_config(folder))
    if config is not None:
        arch = _clean(lambda: hf.architecture(config, folder))
        if arch is not None:
            assert all(isinstance(p, str) for p in hf.config_problems(config, hf.FAMILIES[arch], folder))
    _cli_clean("validate", f"model.path={folder}", "model.seq_length=64")


@FUZZ
@given(data=st.data())
def test_random_safetensors_headers(tmp_path_factory, data):
    path = write_safetensors(
        tmp_path_factory.mktemp("st") / "model.safetensors", data.draw(mutated(json.dumps(HEADER).encode()))
    )
    found = _clean(lambda: hf.read_header(path))
    for info in (found or {}).values():  # what is accepted keeps safetensors' rules
        assert 8 <= info.begin <= info.end <= path.stat().st_size


@FUZZ
@given(data=st.data())
def test_random_shard_indexes(shard_folder, data):
    (shard_folder / hf.INDEX).write_bytes(data.draw(mutated(json.dumps(INDEX).encode())))
    found = _clean(lambda: hf.read_tensors(shard_folder))
    assert found is None or set(found) <= {"a", "b"}


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, []))


@FUZZ
@given(data=st.data())
def test_random_draft_configs(tmp_path_factory, plan, data):
    folder = tmp_path_factory.mktemp("draft")
    (folder / "config.json").write_bytes(data.draw(mutated(json.dumps(DRAFT).encode())))
    found, findings = eagle3_checkpoint.read(folder)
    assert (found is None) == bool(findings)
    if found is not None:
        eagle3_checkpoint.check(found, expected(plan))
    _cli_clean("validate", f"draft.path={folder}")


@FUZZ
@given(data=st.data())
def test_random_data_rows(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("rows")
    good = json.dumps(ROW).encode()
    lines = [good, data.draw(mutated(good)), good]
    path = folder / "rows.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
    got = _clean(lambda: datafile.read_records(str(path)))
    assert got is None or all(isinstance(r.row, int) for r in got[1])
    (folder / "model").mkdir()
    (folder / "model" / "tokenizer.json").write_text("{}")
    _cli_clean("validate", f"data.path={path}", f"model.path={folder / 'model'}")
