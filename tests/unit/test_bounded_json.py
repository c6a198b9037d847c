"""Every JSON specdraft reads from a folder it did not write goes through one bounded parser (specdraft/jsonfile.py)
and then a check of the shape its reader expects: a model's config.json, a safetensors header and shard index, an
EAGLE-3 draft's config.json and a data file's rows. Each hostile file a red team tried (a 5,000-digit integer,
100,000-deep nesting, a list where an object belongs, a value of the wrong type where a reader uses it as a key) is
written here for real and refused with exit 2 through the CLI, naming the file and the field, never as an internal
error.
"""

from __future__ import annotations

import json

import pytest

from specdraft.runtime.models.hf.checkpoint import CheckpointError, read_tensors
from tests.support.cli import run_cli
from tests.support.model_files import DRAFT, HEADER, INDEX, LLAMA, write_safetensors

BIG = "1" + "0" * 4999  # a 5,000-digit integer
DEEP = "[" * 100_000 + "]" * 100_000


def _replace(good: dict, key: str, raw: str) -> str:
    """``good`` as JSON text with ``key``'s value replaced by the raw JSON text ``raw``."""
    marker = "__HOSTILE__"
    return json.dumps({**good, key: marker}).replace(f'"{marker}"', raw)


# (name, key, raw JSON text for its value, what the message must say about the field)
CONFIG_CASES = [
    ("big integer", "hidden_size", BIG, "`hidden_size` is an integer of 5,000 digits"),
    ("deep nesting", "rope_scaling", DEEP, "nested too deeply"),
    ("list for an object", "rope_scaling", "[1, 2]", "`rope_scaling` is a list: must be an object"),
    ("list for a key", "model_type", '["llama"]', "`model_type` is a list: must be a string"),
]


def _refused(got, *needles: str) -> str:
    text = " ".join((got.stdout + got.stderr).split())
    assert got.returncode == 2, text[-3000:]
    assert "internal error" not in text and "Traceback" not in text, text[-3000:]
    for needle in needles:
        assert needle in text, (needle, text[-3000:])
    return text


@pytest.mark.parametrize(("name", "key", "raw", "field"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_hostile_model_config_is_refused_naming_file_and_field(tmp_path, name, key, raw, field):
    good = {k: v for k, v in LLAMA.items() if k != "architectures"} if key == "model_type" else LLAMA
    (tmp_path / "config.json").write_text(_replace(good, key, raw))
    _refused(run_cli("validate", f"model.path={tmp_path}", "model.seq_length=64"), str(tmp_path / "config.json"), field)


DRAFT_CASES = [
    ("big integer", "draft_vocab_size", BIG, "`draft_vocab_size` is an integer of 5,000 digits"),
    ("deep nesting", "eagle_config", DEEP, "nested too deeply"),
    ("an int for the taps", "eagle_config", '{"eagle_aux_hidden_state_layer_ids": 5}',
     "`eagle_config.eagle_aux_hidden_state_layer_ids` is an integer 5: must be a list"),
    ("a string among the taps", "eagle_config", '{"eagle_aux_hidden_state_layer_ids": [1, "x", 4]}',
     "`eagle_config.eagle_aux_hidden_state_layer_ids[1]` is a string 'x': must be an integer"),
    ("list for an object", "eagle_config", "[1]", "`eagle_config` is a list: must be an object"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "key", "raw", "field"), DRAFT_CASES, ids=[c[0] for c in DRAFT_CASES])
def test_a_hostile_draft_config_is_refused_naming_file_and_field(tmp_path, name, key, raw, field):
    (tmp_path / "config.json").write_text(_replace(DRAFT, key, raw))
    _refused(run_cli("validate", f"draft.path={tmp_path}"), str(tmp_path / "config.json"), field)


def test_a_hostile_data_row_is_refused_naming_file_line_and_field(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rows = [
        json.dumps({"messages": chat}),
        _replace({"messages": chat}, "ignored_id", BIG),  # a field the reader never uses
        _replace({"messages": chat}, "meta", DEEP),
        json.dumps({"messages": chat}),
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(rows) + "\n")
    _refused(
        run_cli("validate", f"data.path={data}", f"model.path={tmp_path / 'model'}"),
        str(data),
        "line 2: is not JSON (`ignored_id` is an integer of 5,000 digits",
        "line 3: is not JSON (nested too deeply)",
    )


HEADER_CASES = [
    ("big integer", "a", '{"dtype": "F32", "shape": [2, 3], "data_offsets": [0, ' + BIG + "]}",
     "`a.data_offsets[1]` is an integer of 5,000 digits"),
    ("deep nesting", "a", DEEP, "nested too deeply"),
    ("list for an object", "a", "[0, 24]", "`a` is a list: must be an object"),
    ("list for a dtype", "a", '{"dtype": ["F32"], "shape": [2, 3], "data_offsets": [0, 24]}',
     "`a.dtype` is a list: must be a string"),
    ("no dtype", "a", '{"shape": [2, 3], "data_offsets": [0, 24]}', "`a.dtype` is missing"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "key", "raw", "field"), HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_a_hostile_safetensors_header_is_refused_naming_file_and_field(tmp_path, name, key, raw, field):
    write_safetensors(tmp_path / "model.safetensors", _replace(HEADER, key, raw))
    with pytest.raises(CheckpointError) as err:
        read_tensors(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(err.value) and field in str(err.value), str(err.value)


INDEX_CASES = [
    ("big integer", "metadata", '{"total_size": ' + BIG + "}", "`metadata.total_size` is an integer of 5,000"),
    ("deep nesting", "weight_map", DEEP, "nested too deeply"),
    ("list for an object", "weight_map", '["s1.safetensors"]', "`weight_map` is a list: must be an object"),
    ("a number for a shard", "weight_map", '{"a": 5}', "`weight_map.a` is an integer 5: must be a string"),
    ("a list for a shard", "weight_map", '{"a": ["s1.safetensors"]}', "`weight_map.a` is a list: must be a string"),
]


@pytest.mark.parametrize(("name", "key", "raw", "field"), INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_a_hostile_shard_index_is_refused_naming_file_and_field(tmp_path, name, key, raw, field):
    write_safetensors(tmp_path / "s1.safetensors", json.dumps({"a": HEADER["a"]}), bytes(24))
    (tmp_path / "model.safetensors.index.json").write_text(_replace(INDEX, key, raw))
    with pytest.raises(CheckpointError) as err:
        read_tensors(tmp_path)
    assert str(tmp_path / "model.safetensors.index.json") in str(err.value) and field in str(err.value)


def test_launch_refuses_a_hostile_header_with_exit_2_before_anything_starts(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    write_safetensors(folder / "model.safetensors", _replace(HEADER, "a", HEADER_CASES[0][2]))
    got = run_cli("launch", f"model.path={folder}", "model.seq_length=64", "--executor", "local", "--dry-run")
    _refused(got, str(folder / "model.safetensors"), "`a.data_offsets[1]` is an integer of 5,000 digits")
    assert not (tmp_path / "runs").exists()
