"""Preemption and requeue on the real local Slurm cluster, launched the way a user launches: `specdraft launch
--executor slurm` (submitit submits the rendered script; its srun runs the rank payload on every task). Two ranks
on two emulated nodes. Both jobs must end COMPLETED in sacct with every step in metrics.jsonl exactly once.

- `scontrol requeue` mid-run: Slurm SIGTERMs the tasks; they agree on a step, save and exit 75; the requeued job
  (SLURM_RESTART_COUNT=1) resumes on its own.
- A time limit shorter than the run: Slurm's USR2 warning (`--signal=USR2@12` for 2 minutes); the ranks save and
  rank 0 requeues the job itself.

Both jobs run at once (one module fixture watches both), so the module costs the longer of the two. Slurm holds a
requeued job for about two minutes (BeginTime) before it may start again; the fixture releases it early with
`scontrol update StartTime=now`, the only thing it does to a job besides the requeue under test. Not at once: the
requeue revoked the job's credential on its nodes with one-second resolution, and a restart allocated within that
same second is refused ("Killing non-startable batch JobId=196: Job credential revoked" in slurmctld.log) and the
job ends FAILED. Seen on a loaded machine, where the fixture's poll landed ~150 ms after the requeue; so the
fixture waits RELEASE_AFTER_S from the first time it sees the hold.

Why 2 minutes and not Slurm's smallest limit, 1 minute: Slurm sends the warning up to a minute earlier than asked
(sbatch(1), --signal: "the resolution of event handling"). Measured here: 80-92 s into a 2-minute job (USR2@12),
21-29 s into a 1-minute job (USR2@10). An attempt of a 1-minute job has ~25 s, most of it importing torch and
megatron-core, so it advances a few steps and needed 6 attempts (about 3 minutes) for 30 steps; a 2-minute job
finishes ~100 s of steps in 2 attempts (about 2.5 minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specdraft.runs.checkpoints import MARKER

pytestmark = pytest.mark.slurm
LAYOUT = [
    "cluster.num_nodes=2",
    "cluster.gpus_per_node=1",
    "parallel.cp=1",
    "training.warmup_steps=0",
    "slurm.partition=debug",
    "slurm.cpus_per_task=1",
    "slurm.max_requeues=3",
]
REQUEUE_STEPS = 12
# About 110 s of steps: more than a first attempt can run before the warning (at most 108 s into it), little
# enough that the second attempt finishes before its own warning (at least 48 s into it, ~80 s as measured).
LIMIT_STEPS = 48
RUNS = {
    "requeue": [
        *LAYOUT,
        "slurm.time=00:05:00",
        "training.save_interval=4",
        f"training.train_iters={REQUEUE_STEPS}",
        "slurm.env.SPECDRAFT_STEP_PAUSE_S=0.3",
    ],
    "timelimit": [
        *LAYOUT,
        "slurm.time=00:02:00",
        f"training.train_iters={LIMIT_STEPS}",
        "slurm.env.SPECDRAFT_STEP_PAUSE_S=2",
    ],
}
WATCH_S = 480
RELEASE_AFTER_S = 3.0  # > the one-second resolution of Slurm's credential revocation (see the module docstring)


def _run(cmd: list[str], timeout: float = 15) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.stdout.strip()


def _rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Job:
    folder: Path
    job_id: str
    releases: int = 0
    held_since: float | None = None  # monotonic time the fixture first saw the current requeue's BeginTime hold
    requeued_at: int | None = None  # metrics rows when the test ran `scontrol requeue`
    state: str = "UNKNOWN"  # sacct's, once it left the queue
    status: str = ""  # `specdraft status` at the end
    logs: dict[str, str] = field(default_factory=dict)


CLI = str(Path(sys.executable).with_name("specdraft"))


def launch_all(root: Path, runs: dict[str, list[str]], watch) -> dict[str, Job]:
    """`specdraft launch ARGS --executor slurm` of every run (name -> ARGS) into root/name, then ``watch(jobs)``
    until they are done; whatever is still queued is cancelled, and each Job gets its sacct state and logs."""
    out: dict[str, Job] = {}
    try:
        for name, args in runs.items():
            folder = root / name
            proc = subprocess.run(
                [CLI, "launch", *args, "--executor", "slurm", "--run-dir", str(folder)],
                cwd=root,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr
            out[name] = Job(folder, json.loads((folder / "run.json").read_text())["job_id"])
        watch(out)
    finally:
        for job in out.values():
            if _run(["squeue", "-h", "-j", job.job_id, "-o", "%T"]):
                _run(["scancel", job.job_id])
    for job in out.values():
        job.state = _sacct_state(job.job_id)
        job.logs = {p.name: p.read_text(errors="replace") for p in (job.folder / "submitit").glob("*_log.*")}
    return out


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SPECDRAFT_DEBUG"}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory) -> dict[str, Job]:
    root = tmp_path_factory.mktemp("preempt")
    out = launch_all(root, RUNS, _watch)
    for job in out.values():
        job.status = subprocess.run(
            [CLI, "status", str(job.folder)],
            cwd=root,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    return out


def _watch(jobs: dict[str, Job]) -> None:
    """Until every job left the queue: release each requeue's BeginTime hold; requeue the first job once mid-run."""
    deadline = time.monotonic() + WATCH_S
    requeue = jobs["requeue"]
    while time.monotonic() < deadline:
        queued = False
        for job in jobs.values():
            state = _run(["squeue", "-h", "-j", job.job_id, "-o", "%T|%r"])
            queued = queued or bool(state)
            if state != "PENDING|BeginTime":
                job.held_since = None
            elif job.held_since is None:
                job.held_since = time.monotonic()
            elif time.monotonic() - job.held_since >= RELEASE_AFTER_S:
                _run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"])
                job.releases += 1
                job.held_since = None
        if requeue.requeued_at is None and (requeue.folder / "checkpoints" / "step-4" / MARKER).is_file():
            rows = len(_rows(requeue.folder))
            if rows >= 6:
                _run(["scontrol", "requeue", requeue.job_id])
                requeue.requeued_at = rows
        if not queued:
            return
        time.sleep(0.5)
    pytest.fail(f"jobs still queued or running after {WATCH_S} s: {[j.job_id for j in jobs.values()]}")


def _sacct_state(job_id: str) -> str:
    state: list[str] = []
    for _ in range(60):  # sacct can lag the end of a job by a moment
        state = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"]).split()
        if state and state[0] not in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING"):
            return state[0]
        time.sleep(0.5)
    return state[0] if state else "UNKNOWN"


def _check_every_step_once(job: Job, steps: int) -> list[dict]:
    rows = _rows(job.folder)
    assert [r["step"] for r in rows] == list(range(steps)), "every step exactly once"
    results = [json.loads((job.folder / "results" / f"rank-{r:05d}.json").read_text()) for r in range(2)]
    assert all(r["ok"] and r["steps"] == steps for r in results), results
    return results


def _log(job: Job, rank: int, stream: str = "out") -> str:
    return job.logs.get(f"{job.job_id}_{rank}_log.{stream}", "")


def _story(job: Job) -> str:
    """Why a job did not end COMPLETED: every attempt as sacct saw it, then the end of its stderr."""
    attempts = _run(["sacct", "-D", "-X", "-P", "-j", job.job_id, "-o", "JobID,State,ExitCode,Start,End,NodeList"])
    return f"{attempts}\n--- stderr ---\n{_log(job, 0, 'err')[-3000:]}"


@pytest.mark.timeout(WATCH_S + 240)
def test_scontrol_requeue_mid_run_resumes_and_completes(jobs):
    job = jobs["requeue"]
    assert job.state == "COMPLETED", _story(job)
    assert job.requeued_at is not None and job.requeued_at < REQUEUE_STEPS and job.releases >= 1
    results = _check_every_step_once(job, REQUEUE_STEPS)
    assert results[0]["resumed_step"] >= 4, "the second attempt continued from a checkpoint, not from step 0"
    assert "cotrain preempted (SIGTERM)" in _log(job, 1), "the requeue's SIGTERM reached the payload itself"
    assert "state COMPLETED" in job.status and "attempts (launches): 1:" in job.status
    assert f"restarts of job {job.job_id} by Slurm (requeues): 1" in job.status
    assert f"progress: step {REQUEUE_STEPS}/{REQUEUE_STEPS} reached" in job.status


@pytest.mark.timeout(WATCH_S + 240)
def test_a_time_limit_shorter_than_the_run_requeues_itself_and_completes(jobs):
    job = jobs["timelimit"]
    assert job.state == "COMPLETED", _story(job)
    assert job.releases >= 1
    rank0 = _log(job, 0)
    assert "[specdraft] preempted after step" in rank0 and ": requeued (requeue 1 of at most 3)" in rank0
    assert "cotrain preempted (SIGUSR2) after step" in _log(job, 1), "USR2 reached the payload, not a wrapper"
    results = _check_every_step_once(job, LIMIT_STEPS)
    assert results[0]["resumed_step"] > 0
    restarts = int(job.status.split(f"restarts of job {job.job_id} by Slurm (requeues): ")[1].split()[0])
    assert 1 <= restarts <= 3 and "state COMPLETED" in job.status
