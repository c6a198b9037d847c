"""`specdraft launch` against the real local Slurm cluster (scripts/local-slurm.sh): submitit, sbatch, srun, sacct."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm
BASE = ["slurm.partition=debug", "slurm.cpus_per_task=1", "slurm.time=00:05:00"]
TWO_BY_TWO = ["cluster.num_nodes=2", "cluster.gpus_per_node=2", *BASE]  # tp1 cp2 pp2: 4 ranks on n1, n2
TWO_BY_ONE = ["cluster.num_nodes=2", "cluster.gpus_per_node=1", "parallel.cp=1", *BASE, "--executor", "slurm"]


def _record(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@pytest.mark.timeout(240)
def test_two_nodes_by_two_tasks_pass_and_the_submitted_script_is_the_dry_run(slurm_cluster, specdraft_cli, tmp_path):
    # A hostile run folder: sbatch's #SBATCH parser and bash both get it quoted; nothing in it may run.
    folder = tmp_path / "run $(touch PWNED) `touch PWNED` 'q' ;x"
    # One compiled plan for every step, so a concurrent edit of the built-in layout cannot change it midway.
    plan = tmp_path / "plan.json"
    assert specdraft_cli("plan", *TWO_BY_TWO, "-o", plan).returncode == 0
    dry = specdraft_cli(
        "launch", plan, "--executor", "slurm", "--workload", "selftest", "--dry-run", "--run-dir", folder, text=False
    )
    assert dry.returncode == 0, dry.stderr
    assert not folder.exists()

    proc = specdraft_cli(
        "launch", plan, "--executor", "slurm", "--workload", "selftest", "--run-dir", folder, "--wait", timeout=200
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 4 ranks passed selftest" in proc.stdout
    record = _record(folder)
    assert record["executor"] == "slurm" and record["state"] == "COMPLETED"
    submitted = (folder / "submitit" / f"{record['job_id']}_submission.sh").read_bytes()
    assert submitted == dry.stdout == (folder / "sbatch.sh").read_bytes()
    assert not list(folder.rglob("*.pkl")), "srun runs the payload itself: no submitit wrapper, nothing pickled"

    results = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (folder / "results").glob("*.json")}
    assert sorted(results) == [0, 1, 2, 3]
    for rank, result in results.items():
        assert result["ok"] and all(c["passed"] for c in result["checks"]), result
        assert result["node"] == rank // 2 and result["local_rank"] == rank % 2  # SLURM_NODEID / SLURM_LOCALID
        assert result["slurm_job_id"] == record["job_id"] and result["megatron"] == result["coords"]
    par = json.loads(plan.read_text())["parallel"]
    assert (par["tp"], par["cp"], par["pp"], par["dp"]) == (1, 2, 2, 1), "the default layout changed: redo the sums"
    assert {c["name"]: c["value"] for c in results[3]["checks"]} == {"tp": 4, "cp": 7, "pp": 6, "dp": 4, "tap 1->3": 6}
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()

    follow = specdraft_cli("logs", folder, "--rank", "3", "--follow", timeout=60)
    assert follow.returncode == 0 and "[specdraft] rank 3: selftest ok" in follow.stdout
    again = specdraft_cli("launch", plan, "--executor", "slurm", "--run-dir", folder)
    assert again.returncode == 2 and f"job {record['job_id']}" in again.stderr and "--force" in again.stderr


@pytest.mark.timeout(180)
def test_a_failing_rank_is_named_by_launch_and_status(slurm_cluster, specdraft_cli, tmp_path):
    proc = specdraft_cli("launch", *TWO_BY_ONE, "slurm.env.SPECDRAFT_FAULT_RANK=1", "--wait", timeout=150)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "FAILED: rank 1 (node 1, tp 0 cp 0 pp 1 dp 0) failed first: RuntimeError: injected fault on rank 1"
        in proc.stderr
    )
    assert "_1_log.err" in proc.stderr and "injected fault" in proc.stderr.split("last lines of its stderr")[1]
    status = specdraft_cli("status", timeout=60)
    assert status.returncode == 0 and "FAILED" in status.stdout and "rank 1" in status.stdout


@pytest.mark.timeout(120)
def test_cancel_and_status_shows_cancelled(slurm_cluster, specdraft_cli, tmp_path):
    # --hold keeps the job queued, so the cancel certainly meets a live job.
    proc = specdraft_cli("launch", *TWO_BY_ONE, "slurm.extra_sbatch_args=[--hold]")
    assert proc.returncode == 0, proc.stderr
    folder = next((tmp_path / "runs").iterdir())
    held = specdraft_cli("status", folder.name, timeout=30)
    assert "state PENDING" in held.stdout and "reason JobHeldUser" in held.stdout, held.stdout  # squeue's %r
    cancel = specdraft_cli("cancel", folder.name)
    assert cancel.returncode == 0 and f"cancelled Slurm job {_record(folder)['job_id']}" in cancel.stdout
    deadline = time.monotonic() + 60
    while True:
        status = specdraft_cli("status", folder.name, timeout=30)
        assert status.returncode == 0, status.stderr
        if "state CANCELLED (from sacct)" in status.stdout:
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(1)
    assert "was cancelled" in status.stdout and _record(folder)["state"] == "CANCELLED"
    assert "nothing to cancel" in specdraft_cli("cancel", folder.name).stdout


@pytest.mark.timeout(60)
def test_sbatch_refusing_is_recorded_and_can_be_retried(slurm_cluster, specdraft_cli, tmp_path):
    # A constraint no node has passes preflight (which does not model features) and sbatch refuses it.
    args = [*TWO_BY_ONE, "slurm.extra_sbatch_args=[--constraint=no-such-feature]"]
    for _ in range(2):  # SUBMIT_FAILED means nothing was queued, so the retry needs no --force
        proc = specdraft_cli("launch", *args)
        assert proc.returncode == 2
        assert "sbatch refused the job" in proc.stderr and "invalid feature" in proc.stderr.lower(), proc.stderr
    record = _record(next((tmp_path / "runs").iterdir()))
    assert record["state"] == "SUBMIT_FAILED" and len(record["attempts"]) == 2 and record["job_id"] is None


@pytest.mark.timeout(60)
def test_a_bad_partition_is_refused_by_preflight_before_anything_is_written(slurm_cluster, specdraft_cli, tmp_path):
    proc = specdraft_cli("launch", *TWO_BY_ONE, "slurm.partition=no-such-partition")
    assert proc.returncode == 2
    assert "slurm.partition = 'no-such-partition': the cluster has no partition" in proc.stderr, proc.stderr
    assert "debug" in proc.stderr and "nothing was submitted" in proc.stderr
    assert not (tmp_path / "runs").exists()
