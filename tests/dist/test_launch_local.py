"""`specdraft launch --executor local` end to end: real rank processes on gloo, megatron's process groups."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdraft.execute.local import group_members
from tests.support.paths import SHIPPED
from tests.support.signals import default_sigint

pytestmark = pytest.mark.dist
TWO_RANKS = ["cluster.gpus_per_node=2", "parallel.cp=1"]  # tp1 cp1 pp2: the cheapest world with a tap route


def _run_folder(root: Path) -> Path:
    folders = [p for p in (root / "runs").iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def _results(folder: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (folder / "results").glob("rank-*.json")}


@pytest.mark.timeout(240)
def test_default_layout_passes_every_check_and_is_not_launched_twice(specdraft_cli, tmp_path):
    proc = specdraft_cli("launch", "--executor", "local", "--workload", "selftest", timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "executor: local (requested)" in proc.stderr and "all 4 ranks passed selftest" in proc.stdout
    folder = _run_folder(tmp_path)
    record = json.loads((folder / "run.json").read_text())
    assert record["state"] == "COMPLETED" and record["executor"] == "local" and len(record["attempts"]) == 1
    assert folder.name == f"tiny-cpu-{record['plan_hash'][:8]}"

    plan = json.loads((folder / "plan.json").read_text())
    assert {k: plan["parallel"][k] for k in ("tp", "cp", "pp", "dp", "order")} == {
        "tp": 1,
        "cp": 2,
        "pp": 2,
        "dp": 1,
        "order": "tp-cp-ep-dp-pp",
    }, "the default layout changed: redo the sums"
    # The reference: tp1 cp2 pp2 with order tp-cp-ep-dp-pp puts rank = cp + 2*pp; each rank adds rank+1.
    expected = {
        0: {"tp": 1, "cp": 3, "pp": 4, "dp": 1, "tap 0->2": 4},
        1: {"tp": 2, "cp": 3, "pp": 6, "dp": 2, "tap 1->3": 6},
        2: {"tp": 3, "cp": 7, "pp": 4, "dp": 3, "tap 0->2": 4},
        3: {"tp": 4, "cp": 7, "pp": 6, "dp": 4, "tap 1->3": 6},
    }
    results = _results(folder)
    assert sorted(results) == [0, 1, 2, 3]
    for rank, result in results.items():
        assert result["ok"] and result["global_rank"] == rank and result["backend"] == "gloo"
        assert result["megatron"] == result["coords"]
        assert {c["name"]: c["value"] for c in result["checks"]} == expected[rank]
        assert all(c["passed"] for c in result["checks"])

    # The same plan again (its own plan.json, so an edit of the built-in layout meanwhile cannot change it).
    again = specdraft_cli(
        "launch", folder / "plan.json", "--run-dir", folder, "--executor", "local", "--workload", "selftest"
    )
    assert again.returncode == 2
    for part in (str(folder), f"job {record['job_id']}", "state COMPLETED", "--force"):
        assert part in again.stderr, again.stderr
    assert len(json.loads((folder / "run.json").read_text())["attempts"]) == 1

    status = specdraft_cli("status")
    assert status.returncode == 0 and "COMPLETED" in status.stdout and "4/4 passed" in status.stdout
    listing = specdraft_cli("runs")
    assert folder.name in listing.stdout and "local" in listing.stdout
    logs = specdraft_cli("logs", folder.name, "--rank", "2")
    assert "[specdraft] rank 2: selftest ok" in logs.stdout


@pytest.mark.timeout(180)
def test_a_failing_rank_is_named_with_its_stderr(specdraft_cli, tmp_path):
    proc = specdraft_cli("launch", "--executor", "local", *TWO_RANKS, "slurm.env.SPECDRAFT_FAULT_RANK=1", timeout=150)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "FAILED: rank 1 (node 0, tp 0 cp 0 pp 1 dp 0) failed first: RuntimeError: injected fault on rank 1"
        in proc.stderr
    )
    assert "last lines of its stderr" in proc.stderr and "rank-1.err" in proc.stderr
    folder = _run_folder(tmp_path)
    record = json.loads((folder / "run.json").read_text())
    assert record["state"] == "FAILED" and 1 in record["exit_order"]
    assert not _results(folder)[1]["ok"]
    assert not group_members(record["local"]["pgid"], str(folder / "plan.json"))  # nothing left running


@pytest.mark.timeout(180)
def test_cancel_stops_a_running_local_launch(specdraft_cli, tmp_path):
    launcher = subprocess.Popen(
        [str(Path(sys.executable).with_name("specdraft")), "launch", "--executor", "local", *TWO_RANKS],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            runs = tmp_path / "runs"
            records = list(runs.glob("*/run.json")) if runs.exists() else []
            if records and json.loads(records[0].read_text()).get("state") == "RUNNING":
                break
            assert time.monotonic() < deadline and launcher.poll() is None, "the launch never reached RUNNING"
            time.sleep(0.1)
        folder = records[0].parent
        pgid = json.loads(records[0].read_text())["local"]["pgid"]
        cancel = specdraft_cli("cancel", folder.name)
        assert cancel.returncode == 0 and "cancelled the local run" in cancel.stdout, cancel.stderr
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 2 and "was cancelled" in err
    assert json.loads((folder / "run.json").read_text())["state"] == "CANCELLED"
    assert not group_members(pgid, str(folder / "plan.json"))


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_dry_run_creates_nothing_and_imports_no_executor(tmp_path, executor):
    code = (
        "import json, sys\n"
        "from specdraft.cli.main import main\n"
        f"sys.argv = ['specdraft', 'launch', '--dry-run', '--executor', {executor!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = sorted(m for m in ('submitit', 'torch', 'megatron') if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'heavy': heavy}), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n") and "srun" in proc.stdout
    assert f"executor: {executor}" in proc.stderr and "per-rank command:" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_fp8_layout_plans_but_is_not_launched(specdraft_cli, tmp_path):
    """fp8 renders for Megatron-LM, but the runtime's local layers have no FP8 GEMMs: launch refuses it up front
    (exit 2, the field named), before a run folder or an allocation exists."""
    layout = [SHIPPED / "qwen3-8b.yaml", "training.dtype=fp8"]
    assert specdraft_cli("plan", *layout).returncode == 0
    proc = specdraft_cli("launch", *layout, "--executor", "slurm", "--dry-run", "--run-dir", tmp_path / "run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "training.dtype = 'fp8'" in proc.stderr and "fix: launch with training.dtype=bf16" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.timeout(400)
def test_ctrl_c_waits_for_the_ranks_save(tmp_path):
    """Ctrl-C right after a step: the next step and its save take longer than the old 5 s before SIGKILL (a global
    batch of 128 rows is ~9 s a step here); the launcher waits, every rank saves and stops, nothing is lost."""
    import signal

    from specdraft.execute.monitor import newest_checkpoint

    folder = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("specdraft")),
            "launch",
            "--executor",
            "local",
            *TWO_RANKS,
            "training.global_batch_size=128",
            "training.warmup_steps=0",
            "--steps",
            "50",
            "--run-dir",
            str(folder),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        metrics = folder / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            assert time.monotonic() < deadline and launcher.poll() is None, "no step was ever finished"
            time.sleep(0.05)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=330)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert "stopping: every rank finishes its step and saves a checkpoint" in out + err, out + err
    record = json.loads((folder / "run.json").read_text())
    assert record["state"] == "CANCELLED" and record["exit_codes"] == [75, 75], record
    results = _results(folder)
    steps = {r["preempted"]["step"] for r in results.values()}
    assert len(steps) == 1 and all(r["preempted"]["signal"] == "SIGTERM" for r in results.values())
    newest = newest_checkpoint(folder)
    assert newest is not None and newest[1]["step"] == steps.pop() >= 1
    assert "launch" in err and "--resume" in err  # the failure message says how to continue it
    assert not group_members(record["local"]["pgid"], str(folder / "plan.json"))


@pytest.mark.timeout(300)
def test_a_disk_that_fills_during_a_checkpoint_is_one_message_and_recorded(specdraft_cli, tmp_path):
    """A real 1 MiB tmpfs as the run folder's disk: the first checkpoint fills it, the ranks die without result
    files. The launcher names the folder and the full disk (exit 2), run.json records FAILED and why, and `status`
    keeps working."""
    from tests.support.filesystems import small_filesystem

    with small_filesystem(tmp_path / "disk", "1m") as disk:
        folder = disk / "run"
        args = ("launch", "--executor", "local", *TWO_RANKS, "training.save_interval=2", "--steps", "8")
        proc = specdraft_cli(*args, "--run-dir", folder, timeout=240)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "internal error" not in proc.stderr and f"the filesystem of {folder} is full" in proc.stderr
        record = json.loads((folder / "run.json").read_text())
        assert record["state"] == "FAILED" and "is full" in record["message"]
        status = specdraft_cli("status", folder)
        assert status.returncode == 0 and "FAILED" in status.stdout and "is full" in status.stdout, status.stderr
        assert not group_members(record["local"]["pgid"], str(folder / "plan.json"))
