"""`specdraft launch --resume` and `--resume-from` through the real CLI, with real local launches (--executor local) of
the tiny layout on two ranks (tp1 cp1 pp2) that write checkpoints (training.save_interval).

One run is shared by every check (a module fixture): launched, stopped by USR2 on one rank (every rank saves at the
same step and exits 75), so the run is PREEMPTED; relaunched with --resume, it completes with every step once. Its
checkpoints then serve the refusals (each exit 2 with one message, no traceback, nothing written) and a
--resume-from under another layout (one process).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdraft.runs.checkpoints import MARKER

pytestmark = pytest.mark.dist
STEPS = 8
LAYOUT = [
    "cluster.gpus_per_node=2",
    "parallel.cp=1",
    "training.warmup_steps=1",
    "training.save_interval=2",
    f"training.train_iters={STEPS}",
]
PAUSE = {"SPECDRAFT_STEP_PAUSE_S": "1"}  # the first launch only: slow enough to be caught mid-run


@dataclass
class Life:
    folder: Path
    plan: Path
    while_running: subprocess.CompletedProcess
    preempted: subprocess.CompletedProcess
    preempted_record: dict
    preempted_results: dict[int, dict]
    status: subprocess.CompletedProcess
    listing: subprocess.CompletedProcess
    again: subprocess.CompletedProcess
    stopped_step: int
    resumed: subprocess.CompletedProcess
    resumed_status: subprocess.CompletedProcess


def _record(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


def _rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _results(folder: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (folder / "results").glob("rank-*.json")}


@pytest.fixture(scope="module")
def life(tmp_path_factory) -> Life:
    root = tmp_path_factory.mktemp("resume")
    bin_ = str(Path(sys.executable).with_name("specdraft"))

    def cli(*args, env=None, timeout=240):
        return subprocess.run(
            [bin_, *map(str, args)],
            cwd=root,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    plan, folder = root / "plan.json", root / "run"
    assert cli("plan", *LAYOUT, "-o", plan).returncode == 0
    launch = [bin_, "launch", str(plan), "--run-dir", str(folder), "--executor", "local"]
    first = subprocess.Popen(
        launch, cwd=root, env={**os.environ, **PAUSE}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 180
        while not (folder / "checkpoints" / "step-2" / MARKER).is_file():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.1)
        while_running = cli("launch", plan, "--run-dir", folder, "--executor", "local", "--resume")
        os.kill(_record(folder)["local"]["pids"][1], signal.SIGUSR2)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    preempted = subprocess.CompletedProcess(launch, first.returncode, out, err)
    record, results = _record(folder), _results(folder)
    stopped = results[0].get("preempted", {}).get("step", -1)
    status, listing = cli("status", folder), cli("runs", "--root", root)
    again = cli("launch", plan, "--run-dir", folder, "--executor", "local")
    resumed = cli("launch", plan, "--run-dir", folder, "--executor", "local", "--resume")
    return Life(
        folder,
        plan,
        while_running,
        preempted,
        record,
        results,
        status,
        listing,
        again,
        stopped,
        resumed,
        cli("status", folder),
    )


def test_a_run_stopped_at_a_checkpoint_is_preempted_not_failed(life):
    assert life.preempted.returncode == 75, life.preempted.stdout + life.preempted.stderr
    k = life.stopped_step
    assert 2 <= k < STEPS
    assert (
        "PREEMPTED: job local-" in life.preempted.stderr
        and f"stopped at a checkpoint after step {k}" in life.preempted.stderr
        and "--resume` continues it" in life.preempted.stderr
    )
    assert "Traceback" not in life.preempted.stderr
    record = life.preempted_record
    assert record["state"] == "PREEMPTED" and record["exit_codes"] == [75, 75] and record["exit_order"] == []
    assert {r["preempted"]["step"] for r in life.preempted_results.values()} == {k}, "all stopped after step k"
    # status: the state, the attempts, the step reached and the checkpoint a --resume continues from.
    status = life.status.stdout
    assert life.status.returncode == 0 and "state PREEMPTED" in status
    assert "attempts (launches): 1: #1 local-" in status and "restarts of job" not in status  # local: no requeues
    assert f"progress: step {k}/{STEPS} reached" in status and "stopped at a checkpoint" in status
    assert f"checkpoint: checkpoints/step-{k} is the newest complete one (after step {k})" in status
    assert "PREEMPTED" in life.listing.stdout and life.folder.name in life.listing.stdout


def test_resume_is_refused_while_the_run_is_active_and_a_relaunch_needs_a_flag(life):
    # A local run's launcher holds the launch lock for the whole run (a Slurm run is refused by its state).
    assert life.while_running.returncode == 2 and "is launching or running" in life.while_running.stderr
    assert life.again.returncode == 2
    assert "already launched" in life.again.stderr and "--resume" in life.again.stderr
    assert "Traceback" not in life.while_running.stderr + life.again.stderr


def test_resume_through_the_cli_continues_every_step_once(life):
    assert life.resumed.returncode == 0, life.resumed.stdout + life.resumed.stderr
    k = life.stopped_step
    assert f"resuming from: {life.folder / 'checkpoints' / f'step-{k}'}" in life.resumed.stderr
    assert "all 2 ranks passed cotrain" in life.resumed.stdout
    assert [r["step"] for r in _rows(life.folder)] == list(range(STEPS))
    assert {r["resumed_step"] for r in _results(life.folder).values()} == {k}
    record = _record(life.folder)
    assert record["state"] == "COMPLETED" and [a["state"] for a in record["attempts"]] == ["PREEMPTED", "COMPLETED"]
    assert (life.folder / "attempts" / "1" / "results").is_dir(), "the first attempt's results were archived"
    assert "attempts (launches): 2:" in life.resumed_status.stdout
    assert f"progress: step {STEPS}/{STEPS} reached" in life.resumed_status.stdout


def test_dry_run_shows_the_flag_on_every_rank(life, specdraft_cli):
    dry = specdraft_cli("launch", life.plan, "--run-dir", life.folder, "--executor", "slurm", "--resume", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    srun = [line for line in dry.stdout.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and srun[0].endswith("/plan.json --workload cotrain --resume")
    assert f"# resumes from: {life.folder / 'checkpoints' / f'step-{STEPS}'}" in dry.stderr


def _refused(proc, *parts: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("error: ") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for part in parts:
        assert part in proc.stderr, (part, proc.stderr)


def test_every_refusal_is_one_message_and_writes_nothing(life, specdraft_cli, tmp_path):
    local = ["--executor", "local"]
    newest = life.folder / "checkpoints" / f"step-{STEPS}"
    _refused(
        specdraft_cli("launch", *LAYOUT, "--run-dir", tmp_path / "fresh", *local, "--resume"),
        "--resume: there is no complete checkpoint in",
        "run without --resume",
    )
    # The run's checkpoints in the folder of another spec (same model, another learning rate).
    other = tmp_path / "other-spec"
    other.mkdir()
    shutil.copy(life.folder / ".specdraft-run", other)
    shutil.copytree(life.folder / "checkpoints", other / "checkpoints")
    _refused(
        specdraft_cli("launch", *LAYOUT, "training.lr=0.001", "--run-dir", other, *local, "--resume"),
        "was written by a run of another spec",
        "--resume continues only the same run",
        f"use --resume-from {other / 'checkpoints' / f'step-{STEPS}'}",
    )
    _refused(
        specdraft_cli(
            "launch",
            *LAYOUT,
            "model.hidden_size=32",
            "model.ffn_hidden_size=128",
            "--run-dir",
            tmp_path / "shape",
            *local,
            "--resume-from",
            newest,
        ),
        "holds another model shape",
        "model.hidden_size: checkpoint 64, this plan 32",
        "model.ffn_hidden_size: checkpoint 256, this plan 128",
    )
    _refused(
        specdraft_cli("launch", *LAYOUT, "--run-dir", tmp_path / "x", *local, "--resume-from", tmp_path),
        "is not a complete checkpoint: it has no completion marker",
    )
    _refused(
        specdraft_cli("launch", *LAYOUT, "--run-dir", tmp_path / "x", *local, "--resume", "--resume-from", newest),
        "--resume and --resume-from exclude each other",
    )
    _refused(
        specdraft_cli("launch", *LAYOUT, "--run-dir", tmp_path / "x", *local, "--workload", "selftest", "--resume"),
        "--resume needs --workload cotrain",
    )
    _refused(
        specdraft_cli("launch", life.plan, "--run-dir", life.folder, *local, "--resume-from", newest, "--force"),
        "is a checkpoint of this very run folder",
    )
    for name in ("fresh", "shape", "x"):
        assert not (tmp_path / name).exists(), f"a refused launch wrote {name}"
    assert sorted(p.name for p in other.iterdir()) == [".specdraft-run", "checkpoints"]


def test_resume_from_under_another_layout_continues(life, specdraft_cli, tmp_path):
    # Saved at tp1 cp1 pp2 on two ranks; continued on one process (tp1 pp1) for two more steps.
    single = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1", *LAYOUT[2:]]
    folder = tmp_path / "single"
    source = life.folder / "checkpoints" / f"step-{STEPS}"
    proc = specdraft_cli(
        "launch",
        *single,
        "--run-dir",
        folder,
        "--executor",
        "local",
        "--steps",
        STEPS + 2,
        "--resume-from",
        source,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resuming from: {source}" in proc.stderr and "all 1 ranks passed cotrain" in proc.stdout
    rows = _rows(folder)
    assert [r["step"] for r in rows] == list(range(STEPS + 2))
    assert rows[:STEPS] == _rows(life.folder), "the checkpoint's history, carried over as it was"
    assert _results(folder)[0]["resumed_step"] == STEPS
