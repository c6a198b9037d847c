"""run.json as a typed record, the executor registry, and `cli/` free of executor names."""

from __future__ import annotations

import ast
import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.errors import UserError
from specdraft.execute import executor as executors
from specdraft.execute.executor import Executor
from specdraft.runs.record import RECORD_VERSION, Attempt, RunRecord, new_record, parse_record, read_record
from specdraft.runs.rundir import claim_run_dir, replace_record
from tests.support.paths import REPO

ROOT = REPO / "specdraft"


def _valid(run_dir: Path) -> RunRecord:
    claim_run_dir(run_dir)
    return replace_record(
        run_dir,
        new_record(
            name="tiny-cpu",
            run_dir=str(run_dir),
            executor="slurm",
            job_id="41",
            job_name="tiny-cpu-0123abcd",
            state="COMPLETED",
            intent_epoch=time.time(),
            plan_hash="0123abcd" * 8,
            spec_sha256="ab" * 32,
            specdraft_version="0.1.0",
            world_size=4,
            workload="selftest",
            steps=None,
            attempts=(Attempt(attempt=1, executor="slurm", job_id="41", state="COMPLETED", intent="2026-01-01"),),
        ),
    )


def test_a_record_round_trips(tmp_path):
    written = _valid(tmp_path)
    assert read_record(tmp_path) == written
    assert json.loads((tmp_path / "run.json").read_text())["record_version"] == RECORD_VERSION


BAD = {
    "a list": lambda d: [d],
    "a number": lambda d: 42,
    "a string world_size": lambda d: {**d, "world_size": "4"},
    "world_size 1e9": lambda d: {**d, "world_size": 1e9},
    "world_size 10**9": lambda d: {**d, "world_size": 10**9},
    "world_size 0": lambda d: {**d, "world_size": 0},
    "an option as job id": lambda d: {**d, "job_id": "--user=root"},
    "a job id with a space": lambda d: {**d, "job_id": "41 42"},
    "an option in an attempt": lambda d: {**d, "attempts": [{**d["attempts"][0], "job_id": "-u0"}]},
    "attempts as an object": lambda d: {**d, "attempts": {"attempt": 1}},
    "a missing field": lambda d: {k: v for k, v in d.items() if k != "state"},
    "an unknown field": lambda d: {**d, "surprise": 1},
    "another record version": lambda d: {**d, "record_version": 99},
    "no record version": lambda d: {k: v for k, v in d.items() if k != "record_version"},
    "a state with a line break": lambda d: {**d, "state": "RUNNING\n"},
    "a NaN intent time": lambda d: {**d, "intent_epoch": math.nan},
    "a negative pgid": lambda d: {**d, "local": {"pgid": -1, "pids": [], "launcher_pid": 1}},
    "steps 0": lambda d: {**d, "steps": 0},
    "a name with %": lambda d: {**d, "job_name": "x%j"},
}


def test_every_malformed_record_is_refused_by_name(tmp_path):
    _valid(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    for what, edit in BAD.items():
        with pytest.raises(UserError) as err:
            parse_record(json.dumps(edit(data)), "run.json")
        assert "run.json" in str(err.value), what
    with pytest.raises(UserError, match="not valid JSON"):
        parse_record("[" * 100_000, "run.json")  # nesting deeper than the parser's recursion limit


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    )
)
def test_any_json_is_a_record_or_a_user_error(value):
    try:
        record = parse_record(json.dumps(value), "run.json")
    except UserError:
        return
    assert isinstance(record, RunRecord)


def test_a_corrupt_record_is_exit_2_for_status_logs_and_cancel(tmp_path, specdraft_in_process):
    folder = tmp_path / "runs" / "x"
    _valid(folder)
    (folder / "run.json").write_text(json.dumps({**json.loads((folder / "run.json").read_text()), "world_size": 1e9}))
    for command in ("status", "logs", "cancel"):
        proc = specdraft_in_process(command, folder)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "world_size: expected int" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_registry_holds_complete_executors():
    for name in executors.names():
        cls = executors.executor_class(name)
        assert issubclass(cls, Executor) and cls.name == name
        instance = executors.get(name)  # abstract methods left out would raise here
        assert instance.log_paths(
            new_record(
                name="n",
                run_dir="/r",
                executor=name,
                job_id=None,
                job_name="n-1",
                state="PENDING",
                intent_epoch=0.0,
                plan_hash="h",
                spec_sha256="s",
                specdraft_version="v",
                world_size=1,
                workload="selftest",
            ),
            0,
        )
    with pytest.raises(UserError, match="--executor 'kubernetes' is not an executor"):
        executors.choose("kubernetes")


def test_nothing_outside_execute_compares_executor_names():
    names = set(executors.names())
    found = []
    for path in ROOT.rglob("*.py"):
        if "execute" in path.relative_to(ROOT).parts or "runtime" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    found += [
                        f"{path.relative_to(ROOT)}:{node.lineno}"
                        for v in values
                        if isinstance(v, ast.Constant) and v.value in names
                    ]
    assert not found, f"branches on an executor's name outside execute/: {found}"
