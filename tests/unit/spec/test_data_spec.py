"""The layout's data section: its rules (an absolute .jsonl/.parquet path, an absolute tokenizer folder, no Markov
drift on a file, rows that hold whole padded samples, warnings for settings that need a file) and the resolved data
section the compiled plan carries for the runtime (seed, tokenizer folder, length multiple)."""

from __future__ import annotations

import pytest

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.plan.model import LaunchPlan
from specdraft.spec.load import load_layout
from specdraft.spec.validate import validate_fields

FILE = ["data.path=/data/chats.jsonl", "model.path=/models/llama"]


def _problems(*overrides) -> tuple[list[str], list[str]]:
    errors, warnings = validate_fields(load_layout(None, list(overrides)))
    return [f"{p.path}: {p.rule}" for p in errors], [f"{p.path}: {p.rule}" for p in warnings]


def test_a_data_file_needs_absolute_paths_and_a_known_suffix():
    assert _problems(*FILE) == ([], [])
    assert _problems("data.path=/data/chats.parquet", "model.path=/m") == ([], [])
    errors, _ = _problems("data.path=chats.csv", "model.path=models/llama")
    assert errors == [
        "data.path: must name a .jsonl or .parquet file (the suffix says how to read it)",
        "data.path: must be an absolute path (the ranks run inside the run folder)",
        "model.path: must be the absolute path of a local folder when data.path is set: the ranks read its "
        "tokenizer files",
    ]


def test_markov_only_settings_and_row_sizes():
    errors, _ = _problems(*FILE, "training.data_drift_interval=5")
    assert errors == ["training.data_drift_interval: drifts only the built-in Markov chain; a data file is what it is"]
    errors, _ = _problems(*FILE, "model.seq_length=72")
    assert len(errors) == 1 and errors[0].startswith("model.seq_length: micro_batch_size x seq_length (72)")
    assert _problems("model.seq_length=72") == ([], []), "the Markov chain's rows are checked by the runtime"
    _, warnings = _problems("data.format=text", "data.seed=3", "data.shuffle=false")
    assert [w.split(":")[0] for w in warnings] == ["data.format", "data.shuffle", "data.seed"]
    with pytest.raises(SpecError, match=r"data.seed = -1: is below specdraft's bound of 0"):
        compile(load_layout(None, [*FILE, "data.seed=-1"]))


def test_the_plan_carries_the_resolved_data_section():
    plan = compile(load_layout(None, [*FILE, "training.seed=9"]))
    d = plan.data
    assert (d.path, d.format, d.tokenizer, d.shuffle, d.seed) == ("/data/chats.jsonl", "auto", "/models/llama", True, 9)
    assert d.length_multiple == 16 and plan.parallel.pad_multiple == 4
    assert compile(load_layout(None, [*FILE, "data.seed=5"])).data.seed == 5
    markov = compile(load_layout(None, ["data.seed=5", "training.data_drift_interval=4"])).data
    assert (markov.path, markov.tokenizer, markov.seed, markov.drift_interval) == (None, None, 1234, 4)
    big = compile(
        load_layout(
            None,
            [
                *FILE,
                "parallel.cp=8",
                "parallel.tp=2",
                "parallel.pp=1",
                "cluster.gpus_per_node=16",
                "parallel.sequence_parallel=true",
                "model.seq_length=128",
            ],
        )
    )
    assert big.parallel.pad_multiple == 32 and big.data.length_multiple == 32
    assert LaunchPlan.from_json(plan.to_json()) == plan
