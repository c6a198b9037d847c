"""What status, runs and a relaunch make of a run that stopped at a checkpoint, without running ranks: crafted result
files and checkpoint folders, and stub Slurm tools (tests/unit/execute/test_launch_hostile.py's) for what Slurm says.

- A Slurm job that ended FAILED only because every rank saved and exited 75 (no requeue left) is PREEMPTED.
- Slurm's restarts of a job come from `sacct --duplicates`, one row per run of the job id.
- The newest complete checkpoint status shows is the one --resume takes, found without following a link or
  blocking on a FIFO; a relaunch from step 0 moves the old checkpoints and metrics aside, --resume keeps them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specdraft.execute import launch, monitor
from specdraft.execute.slurm import commands as slurmcmd
from specdraft.runs.checkpoints import MARKER
from specdraft.runs.rundir import read_record
from tests.support.checkpoints import fake_checkpoint
from tests.unit.execute.test_launch_hostile import _behave, _run_folder, slurm_stubs  # noqa: F401 - slurm_stubs is a fixture


def _results(folder: Path, preempted: dict | None, world_size: int = 2, **fields) -> None:
    (folder / "results").mkdir(exist_ok=True)
    for rank in range(world_size):
        record = {
            "global_rank": rank,
            "ok": False,
            "terminated": True,
            "checks": [],
            "error": None,
            "slurm_job_id": "12345",
            "preempted": preempted,
            **fields,
        }
        (folder / "results" / f"rank-{rank:05d}.json").write_text(json.dumps(record))


def _checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    return fake_checkpoint(folder / "checkpoints" / f"step-{step}", None, step, complete=complete, shard=b"x" * 100)


def test_a_slurm_job_that_failed_only_by_stopping_at_a_checkpoint_is_preempted(tmp_path, slurm_stubs, monkeypatch):
    folder = _run_folder(tmp_path / "run")
    _checkpoint(folder, 8)
    stopped = {
        "signal": "SIGUSR2",
        "step": 8,
        "checkpoint": str(folder / "checkpoints" / "step-8"),
        "requeue": {
            "requeued": False,
            "reason": "slurm.max_requeues=3 reached (this job was restarted 3 time(s))",
            "restarts": 3,
        },
    }
    _results(folder, stopped)
    _behave(monkeypatch, "sacct", out="12345|FAILED|n[1-2]\n")
    state, record, seen = monitor.current_state(folder, read_record(folder))
    assert state == "PREEMPTED" and record.state == "PREEMPTED" and record.attempts[-1].state == "PREEMPTED"
    assert record.message == "every rank stopped at a checkpoint"

    class Plan:  # what problem() reads of a plan
        world_size = 2

    message = monitor.problem(folder, record, state, Plan)
    assert message.startswith("job 12345 was preempted (SIGUSR2); not requeued: slurm.max_requeues=3 reached")
    assert f"stopped at a checkpoint after step 8 ({folder / 'checkpoints' / 'step-8'})" in message
    assert f"`specdraft launch {folder / 'plan.json'} --run-dir {folder} --resume` continues it" in message
    # One rank that raised instead: FAILED stays FAILED.
    other = _run_folder(tmp_path / "other")
    _results(other, stopped)
    (other / "results" / "rank-00001.json").write_text(
        json.dumps({"global_rank": 1, "ok": False, "checks": [], "error": "boom"})
    )
    _behave(monkeypatch, "sacct", out="12345|FAILED|n[1-2]\n")
    assert monitor.current_state(other, read_record(other))[0] == "FAILED"


def test_restarts_are_counted_from_sacct_duplicates(tmp_path, slurm_stubs, monkeypatch):
    _behave(monkeypatch, "sacct", out="12345\n12345\n12345\n")
    assert slurmcmd.restarts("12345") == 2
    _behave(monkeypatch, "sacct", out="")
    assert slurmcmd.restarts("12345") is None  # sacct does not know the job
    _behave(monkeypatch, "sacct", rc=1, err="sacct: error: slurmdbd is down\n")
    assert slurmcmd.restarts("12345") is None
    assert all(c[:2] == ["sacct", "-X"] and "--duplicates" in c and "--jobs=12345" in c for c in slurm_stubs())


def test_status_shows_the_checkpoint_resume_would_take_and_reads_it_safely(tmp_path):
    folder = _run_folder(tmp_path / "run", executor="local", job_id="local-4242", state="PREEMPTED")
    assert monitor.newest_checkpoint(folder) is None
    _checkpoint(folder, 2)
    _checkpoint(folder, 4)
    _checkpoint(folder, 9, complete=False)  # half-written: no marker
    assert monitor.newest_checkpoint(folder)[0] == "checkpoints/step-4"
    (folder / "checkpoints" / "step-4" / "__0_0.distcp").write_bytes(b"x" * 7)  # cut short
    os.mkfifo(folder / "checkpoints" / "step-9" / MARKER)  # read non-blocking: refused, never waited on
    assert monitor.newest_checkpoint(folder)[0] == "checkpoints/step-2"
    outside = tmp_path / "outside"
    (folder / "checkpoints").rename(outside)
    (folder / "checkpoints").symlink_to(outside)  # a link is not followed: no checkpoint
    assert monitor.newest_checkpoint(folder) is None


def test_a_relaunch_from_step_0_moves_the_old_history_aside_and_resume_keeps_it(tmp_path):
    folder = _run_folder(tmp_path / "run", executor="local", job_id="local-4242", state="PREEMPTED")
    _checkpoint(folder, 4)
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    (folder / "results").mkdir()
    launch._archive(str(folder), 2, resume=True)
    assert (folder / "checkpoints" / "step-4").is_dir() and (folder / "metrics.jsonl").is_file()
    assert (folder / "attempts" / "1" / "results").is_dir()
    launch._archive(str(folder), 3, resume=False)
    assert not (folder / "checkpoints").exists() and not (folder / "metrics.jsonl").exists()
    assert (folder / "attempts" / "2" / "checkpoints" / "step-4" / MARKER).is_file()
    assert (folder / "attempts" / "2" / "metrics.jsonl").read_text() == '{"step": 0}\n'


@pytest.mark.parametrize("state", ["PREEMPTED", "TIMEOUT", "CANCELLED"])
def test_a_run_with_a_checkpoint_says_how_to_continue_it(tmp_path, state):
    folder = _run_folder(tmp_path / "run", executor="local", job_id="local-4242", state=state)
    _checkpoint(folder, 6)

    class Plan:  # what problem() reads of a plan
        world_size = 2

        class slurm:
            time = "00:10:00"

    message = monitor.problem(folder, read_record(folder), state, Plan)
    assert (
        "newest complete checkpoint is checkpoints/step-6" in message and "--resume` continues from there" in message
    ), message
