"""Fuzzing the run folder's files the way tests/unit/spec/test_fuzz_spec.py fuzzes layouts: random and mutated
checkpoint markers, manifests, metrics lines, rank results, run.json and plan.json. Whatever they hold, each reader
ends in its value or a clean refusal (CorruptCheckpoint, ResumeError, a SpecdraftError), and `specdraft status`
through the CLI's one error boundary ends in exit 0 (a damaged checkpoint, result or metrics line is shown, never
fatal) or exit 2 (run.json and plan.json), never another exception.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.assemble import compile
from specdraft.errors import SpecdraftError
from specdraft.execute import monitor
from specdraft.execute.report import read_results
from specdraft.runs import checkpoints as files
from specdraft.runtime.serve import offline
from specdraft.spec.load import load_layout
from tests.support.cli import run_cli
from tests.support.json_fuzz import TOKENS, mutated, values
from tests.support.run_folder import STEPS, make_run_folder, preempted_record, result_record

FUZZ = settings(
    max_examples=int(os.environ.get("SPECDRAFT_FUZZ_EXAMPLES", "60")),
    deadline=timedelta(seconds=20),
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, ["training.save_interval=2"]))


@pytest.fixture(scope="module")
def folder(tmp_path_factory, plan):
    return make_run_folder(tmp_path_factory.mktemp("fuzz") / "run", plan)


@pytest.fixture(scope="module")
def good(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def status_of(folder) -> int:
    """`specdraft status FOLDER` in this process: 0 or 2, never a traceback or an internal error."""
    got = run_cli("status", folder)
    text = got.stdout + got.stderr
    assert got.returncode in (0, 2), text[-2000:]
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    return got.returncode


def _restore(folder, good):
    for path, data in good.items():
        path.write_bytes(data)
    extra = folder / "checkpoints" / f"step-{STEPS}"
    for path in extra.iterdir():
        if path not in good:
            path.unlink() if not path.is_dir() else shutil.rmtree(path)


def _marker(folder):
    return folder / "checkpoints" / f"step-{STEPS}" / files.MARKER


@FUZZ
@given(data=st.data())
def test_random_markers_and_manifests(folder, good, plan, data):
    marker = _marker(folder)
    original = good[marker]
    if data.draw(st.booleans()):
        text = data.draw(mutated(original))
    else:  # the manifest alone: random names and entries
        meta = json.loads(original)
        names = st.sampled_from(sorted(meta["manifest"]) + TOKENS) | st.text(max_size=12)
        meta["manifest"] = data.draw(st.dictionaries(names, values | st.sampled_from(list(meta["manifest"].values()))))
        text = json.dumps(meta).encode()
    marker.write_bytes(text)
    try:
        step = marker.parent
        try:
            meta = files.check_checkpoint(step, hash_limit=float("inf"))
            files.check_compatible(meta, plan, step)
            files.same_layout(meta, plan)
        except (files.CorruptCheckpoint, files.ResumeError):
            pass
        for mode, source in (("newest", None), ("from", step), ("auto", None)):
            try:
                files.choose(folder, plan, mode, source, lambda _: None, 10)
            except files.ResumeError:
                pass
        monitor.checkpoint_report(folder)
        for which in (None, STEPS):
            try:
                offline.checkpoint(folder, which)
            except offline.LoadError:
                pass
        assert status_of(folder) == 0
    finally:
        _restore(folder, good)


@FUZZ
@given(data=st.data())
def test_random_metrics_lines_and_results(folder, good, plan, data):
    metrics = folder / "metrics.jsonl"
    lines = good[metrics].splitlines()
    at = data.draw(st.integers(0, len(lines) - 1))
    lines[at] = data.draw(mutated(lines[at]))
    metrics.write_bytes(b"\n".join(lines) + b"\n")
    # Every rank's result mutated alike (a preempted run's, or a finished one's): what status and problem() read.
    template = (preempted_record if data.draw(st.booleans()) else lambda r, _: result_record(r))(0, folder)
    text = data.draw(mutated(json.dumps(template).encode()))
    for rank in range(plan.world_size):
        (folder / "results" / f"rank-{rank:05d}.json").write_bytes(
            text.replace(b'"global_rank": 0', f'"global_rank": {rank}'.encode())
        )
    try:
        rows = monitor.read_metrics(folder)
        assert all(isinstance(r, dict) for r in rows)
        files.metrics_rows(folder, STEPS)
        results = read_results(folder, plan.world_size)
        assert set(results) <= set(range(plan.world_size))
        for state in ("COMPLETED", "PREEMPTED", "FAILED", "CANCELLED"):
            monitor.problem(folder, monitor.read_record(folder), state, plan)
        assert status_of(folder) == 0
    finally:
        _restore(folder, good)


@FUZZ
@given(data=st.data(), name=st.sampled_from(["run.json", "plan.json"]))
def test_random_run_records_and_plans(folder, good, plan, data, name):
    path = folder / name
    path.write_bytes(data.draw(mutated(good[path])))
    try:
        for read in (monitor.read_record, monitor.read_plan):
            try:
                read(folder)
            except SpecdraftError:
                pass
        status_of(folder)
    finally:
        _restore(folder, good)
