"""Checkpoint folders without torch: what counts as complete, which one a resume takes and what it refuses, pruning,
metrics rewritten to a step, the spec fields' rules and the Slurm requeue decision."""

from __future__ import annotations

import json
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.runs import checkpoints as files
from specdraft.runtime.train import preempt
from specdraft.spec.load import load_layout
from tests.support.checkpoints import fake_checkpoint


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, ["training.save_interval=2"]))


def _fake(run_dir, plan, step, *, complete=True, **meta_overrides):
    """A step folder with 'shards' and metadata; with a marker describing ``plan`` unless incomplete."""
    return fake_checkpoint(files.step_dir(run_dir, step), plan, step, complete=complete, **meta_overrides)


def test_a_marker_records_layout_shape_spec_and_a_manifest_that_catches_damage(tmp_path, plan):
    folder = _fake(tmp_path, plan, 3)
    meta = files.check_checkpoint(folder, hash_limit=float("inf"))
    assert meta["step"] == 3 and meta["spec_sha256"] == plan.spec_sha256
    assert meta["parallel"]["cp"] == plan.parallel.cp and meta["model"]["hidden_size"] == plan.model.hidden_size
    assert {rel: entry["size"] for rel, entry in meta["manifest"].items()} == {
        ".metadata": (folder / ".metadata").stat().st_size,
        "__0_0.distcp": 13,
        "common.pt": 1,
    }
    assert meta["draft"]["vocab_size"] == plan.draft.vocab_size
    (folder / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(files.CorruptCheckpoint, match="__0_0.distcp has 1 bytes, the marker says 13"):
        files.check_checkpoint(folder)
    (folder / "__0_0.distcp").unlink()
    with pytest.raises(files.CorruptCheckpoint, match="__0_0.distcp is missing"):
        files.check_checkpoint(folder)
    (folder / files.MARKER).write_text("{not json")
    with pytest.raises(files.CorruptCheckpoint, match="not valid JSON"):
        files.check_checkpoint(folder)
    (folder / files.MARKER).unlink()
    with pytest.raises(files.CorruptCheckpoint, match="no completion marker"):
        files.check_checkpoint(folder)


def test_resume_takes_the_newest_complete_one_and_names_what_it_skips(tmp_path, plan):
    for step in (2, 4):
        _fake(tmp_path, plan, step)
    _fake(tmp_path, plan, 6, complete=False)
    broken = _fake(tmp_path, plan, 5)
    (broken / "common.pt").write_bytes(b"longer")  # shard sizes are checked at the choice, hashes at the load
    warnings = []
    found = files.choose(tmp_path, plan, "newest", None, warnings.append)
    assert [f.name for f, _ in found] == ["step-4", "step-2"]
    assert warnings == [
        f"skipping checkpoint {tmp_path / 'checkpoints' / 'step-6'}: it has no completion marker "
        "(half-written: the run stopped while saving it)",
        f"skipping checkpoint {broken}: common.pt has 6 bytes, the marker says 1",
    ]


def test_refusals_say_why(tmp_path, plan):
    with pytest.raises(files.ResumeError, match="--resume: there is no complete checkpoint in .*checkpoints"):
        files.choose(tmp_path, plan, "newest", None, print)
    assert files.choose(tmp_path, plan, "auto", None, print) == []  # a requeued job that never saved starts over
    other = compile(load_layout(None, ["training.lr=1e-4"]))
    folder = _fake(tmp_path, other, 4)
    with pytest.raises(files.ResumeError) as err:
        files.choose(tmp_path, plan, "newest", None, print)
    text = str(err.value)
    assert f"{folder} was written by a run of another spec (spec sha256 {other.spec_sha256[:12]}" in text
    assert f"this plan's is {plan.spec_sha256[:12]}" in text and f"use --resume-from {folder}" in text
    assert files.choose(tmp_path, plan, "from", folder, print)[0][0] == folder  # the same model: allowed
    wider = compile(load_layout(None, ["model.hidden_size=128", "draft.num_layers=2"]))
    with pytest.raises(files.ResumeError) as err:
        files.choose(tmp_path, wider, "from", folder, print)
    text = str(err.value)
    assert "model.hidden_size: checkpoint 64, this plan 128" in text and "model.head_dim: checkpoint 16" in text
    assert "draft.num_layers: checkpoint 1, this plan 2" in text and "num_layers:" not in text.replace(
        "draft.num_layers", ""
    )
    with pytest.raises(files.ResumeError, match="no such checkpoint folder"):
        files.choose(tmp_path, plan, "from", tmp_path / "nowhere", print)
    (folder / files.MARKER).unlink()
    with pytest.raises(files.ResumeError, match="is not a complete checkpoint: it has no completion marker"):
        files.choose(tmp_path, plan, "from", folder, print)


def test_prune_keeps_the_newest_complete_ones_and_whatever_is_newer(tmp_path, plan):
    for step in (1, 2, 4, 5):
        _fake(tmp_path, plan, step)
    _fake(tmp_path, plan, 3, complete=False)  # stale: older than complete ones
    _fake(tmp_path, plan, 6, complete=False)  # newer than all: being written
    removed = files.prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["step-1", "step-2", "step-3"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-4", "step-5", "step-6"]


@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=30), st.integers(0, 10))
def test_metrics_rows_keep_each_step_below_the_checkpoint_once_in_order(tmp_path_factory, rows, upto):
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    lines = []
    for step, torn in rows:
        line = json.dumps({"step": step, "target_loss": step / 7})
        lines.append(line[: len(line) // 2] if torn else line)
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    kept = [json.loads(line)["step"] for line in files.metrics_rows(path.parent, upto)]
    assert kept == sorted({s for s, torn in rows if not torn and s < upto})


def test_negative_counts_are_refused_by_name():
    with pytest.raises(SpecError) as err:
        compile(
            load_layout(None, ["training.save_interval=-1", "training.keep_checkpoints=0", "slurm.max_requeues=-1"])
        )
    text = str(err.value)
    assert "training.save_interval = -1: must be >= 0" in text
    assert "training.keep_checkpoints = 0: must be >= 1" in text and "slurm.max_requeues = -1: must be >= 0" in text


def test_requeue_is_bounded_and_a_requeued_job_resumes_on_its_own(plan):
    assert preempt.request_requeue(plan, {}) == {
        "requeued": False,
        "restarts": 0,
        "reason": "not running under Slurm (no SLURM_JOB_ID)",
    }
    spent = preempt.request_requeue(plan, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "3"})
    assert not spent["requeued"]
    assert spent["reason"] == "slurm.max_requeues=3 reached (this job was restarted 3 time(s))"
    assert preempt.resume_mode_from_env({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}) == "auto"
    assert preempt.resume_mode_from_env({"SLURM_JOB_ID": "7"}) is None
    assert preempt.resume_mode_from_env({"SLURM_RESTART_COUNT": "2"}) is None


def test_a_stop_signal_is_a_flag_inside_the_loop_and_an_exception_outside(monkeypatch):
    monkeypatch.setattr(preempt, "_received", [])
    monkeypatch.setattr(preempt, "_graceful", False)
    preempt._handler(signal.SIGUSR2, None)
    assert preempt.requested() == signal.SIGUSR2
    with pytest.raises(preempt.Terminated):
        preempt._handler(signal.SIGTERM, None)
    with preempt.graceful():
        preempt._handler(signal.SIGTERM, None)  # waits for the step boundary
        with pytest.raises(preempt.Terminated, match="SIGTERM"):
            preempt._handler(signal.SIGTERM, None)  # a second one: the way out of a hung step
