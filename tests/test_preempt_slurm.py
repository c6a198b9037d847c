"""Preemption and requeue on the real local Slurm cluster: two ranks on two emulated nodes, srun running the rank
payload directly (the sbatch script's `direct` shape; under submitit its own USR2 handler interferes, see
docs/checkpoints.md). Both jobs must end COMPLETED in sacct with every step in metrics.jsonl exactly once.

- `scontrol requeue` mid-run: Slurm SIGTERMs the tasks; they agree on a step, save and exit 75; the requeued job
  (SLURM_RESTART_COUNT=1) resumes on its own.
- A time limit shorter than the run: Slurm's USR2 warning; the ranks save and rank 0 requeues the job itself.

Slurm holds a requeued job for about two minutes (BeginTime); the tests release it at once with
`scontrol update StartTime=now`, which is the only thing they do to the job besides the requeue under test.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest

from specdraft.runtime.preempt import PREEMPTED_EXIT
from tests.rank_procs import metrics, write_plan

pytestmark = pytest.mark.slurm
LAYOUT = ["cluster.num_nodes=2", "cluster.gpus_per_node=1", "parallel.cp=1", "training.warmup_steps=0",
          "slurm.partition=debug", "slurm.cpus_per_task=1", "slurm.max_requeues=3"]
SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time={time}
#SBATCH --signal=USR2@{delay}
#SBATCH --partition=debug
#SBATCH --chdir={run_dir}
#SBATCH --output={run_dir}/slurm-%j.out
#SBATCH --open-mode=append
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 40000 ))
export MASTER_ADDR MASTER_PORT OMP_NUM_THREADS=1 {env}
echo "[test] attempt ${{SLURM_RESTART_COUNT:-0}} starts"
srun --kill-on-bad-exit=1 {python} -u -m specdraft.runtime.entry {plan} --workload cotrain
"""


def _run(cmd: list[str], timeout: float = 15) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.stdout.strip()


def _submit(run_dir, plan, *, time_limit: str, env: str = "") -> str:
    script = run_dir / "job.sh"
    script.write_text(SCRIPT.format(name=f"specdraft-test-{run_dir.name}", time=time_limit,
                                    delay=plan.slurm.signal_delay_s, run_dir=shlex.quote(str(run_dir)), env=env,
                                    python=shlex.quote(sys.executable), plan=shlex.quote(str(run_dir / "plan.json"))))
    job_id = _run(["sbatch", "--parsable", str(script)])
    assert job_id.isdigit(), job_id
    return job_id


def _finish(job_id: str, timeout: float, during=None) -> tuple[str, int]:
    """Wait for the job to leave the queue, releasing each requeue's BeginTime hold; (sacct state, releases)."""
    deadline = time.monotonic() + timeout
    releases = 0
    try:
        while time.monotonic() < deadline:
            state = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"])
            if not state:
                break
            if state == "PENDING|BeginTime":
                _run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
                releases += 1
            if during is not None:
                during()
            time.sleep(0.5)
        else:
            pytest.fail(f"job {job_id} still queued or running after {timeout} s")
    finally:
        if _run(["squeue", "-h", "-j", job_id, "-o", "%T"]):
            _run(["scancel", job_id])
    for _ in range(60):  # sacct can lag the end of a job by a moment
        state = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]).split()
        if state and state[0] not in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING"):
            return state[0], releases
        time.sleep(0.5)
    return state[0] if state else "UNKNOWN", releases


def _check_every_step_once(run_dir, steps: int) -> list[dict]:
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps)), "every step exactly once"
    results = [json.loads((run_dir / "results" / f"rank-{r:05d}.json").read_text()) for r in range(2)]
    assert all(r["ok"] and r["steps"] == steps for r in results), results
    return results


@pytest.mark.timeout(420)
def test_scontrol_requeue_mid_run_resumes_and_completes(slurm_cluster, tmp_path):
    steps = 16
    run_dir = tmp_path / "requeue"
    plan = write_plan(run_dir, [*LAYOUT, "training.save_interval=4", f"training.train_iters={steps}"])
    job_id = _submit(run_dir, plan, time_limit="00:10:00", env="SPECDRAFT_STEP_PAUSE_S=0.2")
    requeued = []

    def requeue_once_mid_run():
        if not requeued and (run_dir / "checkpoints" / "step-4").is_dir() and len(metrics(run_dir)) >= 6:
            _run(["scontrol", "requeue", job_id])
            requeued.append(len(metrics(run_dir)))

    state, releases = _finish(job_id, 360, during=requeue_once_mid_run)
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert requeued and releases >= 1 and "[test] attempt 1 starts" in log
    results = _check_every_step_once(run_dir, steps)
    assert results[0]["resumed_step"] >= 4, "the second attempt continued from a checkpoint, not from step 0"
    assert requeued[0] < steps


@pytest.mark.timeout(600)
def test_a_time_limit_shorter_than_the_run_requeues_itself_and_completes(slurm_cluster, tmp_path):
    # At least 120 s of steps (the pause alone) against a 2-minute limit: the run cannot finish in one attempt.
    # Slurm sends the USR2 warning between ~60 s and 108 s in (it measured 78 s here: its timer is coarse).
    steps = 80
    run_dir = tmp_path / "timelimit"
    plan = write_plan(run_dir, [*LAYOUT, "slurm.time=00:02:00", f"training.train_iters={steps}"])
    job_id = _submit(run_dir, plan, time_limit="00:02:00", env="SPECDRAFT_STEP_PAUSE_S=1.5")
    state, releases = _finish(job_id, 540)
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert releases >= 1 and "[test] attempt 1 starts" in log
    assert "[specdraft] preempted after step" in log and ": requeued (requeue 1 of at most 3)" in log
    assert "cotrain preempted (SIGUSR2) after step" in log and f"exit code {PREEMPTED_EXIT}" in log
    results = _check_every_step_once(run_dir, steps)
    assert results[0]["resumed_step"] > 0
