"""A GRPO run requeued mid-run on the real local Slurm cluster (`scontrol requeue`) resumes on its own and ends
COMPLETED, every step in metrics.jsonl exactly once, its metrics (timing fields aside) equal to an uninterrupted
run's: the RL state (policy, draft, both optimizers, the reference, the prompt position, RNG) survives the requeue.

Two jobs at once, the same plan: 2 ranks (pp2) on one emulated node each. The requeue's SIGTERM lets the ranks
agree on a step and save there, so the second attempt runs only steps it never ran: the uninterrupted job is
what those steps must equal. draft.refit_interval = the step count puts every resume point between two draft
refits, where the resumed engine must start with the older draft the interrupted one held (it used to start with
the trainer's newer one, and step 3's rollouts differed). The watcher and its release of Slurm's requeue hold
are tests/slurm/test_preempt_slurm.py's (see its docstring for why the release waits RELEASE_AFTER_S).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.slurm.test_preempt_slurm import RELEASE_AFTER_S, Job, _rows, _run, launch_all
from tests.support.grpo_metrics import without_timing
from tests.support.paths import SHIPPED

pytestmark = pytest.mark.slurm
LAYOUT = SHIPPED / "grpo-tiny-cpu.yaml"
STEPS = 6
OVERRIDES = [
    "cluster.gpus_per_node=2",
    "grpo.sft_steps=1",
    "grpo.reference_policy_kl_penalty=0.1",  # the frozen reference is part of the state
    f"draft.refit_interval={STEPS}",  # every resume point lies between two draft refits
    "training.save_interval=2",
    f"training.train_iters={STEPS}",
    "slurm.partition=debug",
    "slurm.cpus_per_task=1",
    "slurm.time=00:05:00",
    "slurm.max_requeues=3",
    "slurm.env.SPECDRAFT_STEP_PAUSE_S=1",
]
REQUEUE_AT_ROWS = 3  # mid-run: steps 0-2 logged (the SFT step, two RL steps), three still to run
WATCH_S = 240


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory) -> dict[str, Job]:
    args = [str(LAYOUT), *OVERRIDES, "--workload", "grpo"]
    return launch_all(tmp_path_factory.mktemp("grpo-requeue"), {"requeued": args, "uninterrupted": args}, _watch)


def _watch(jobs: dict[str, Job]) -> None:
    """Until both jobs left the queue: requeue the first once mid-run, release its requeue hold."""
    deadline = time.monotonic() + WATCH_S
    job = jobs["requeued"]
    while time.monotonic() < deadline:
        queued = any(_run(["squeue", "-h", "-j", j.job_id, "-o", "%T"]) for j in jobs.values())
        state = _run(["squeue", "-h", "-j", job.job_id, "-o", "%T|%r"])
        if state != "PENDING|BeginTime":
            job.held_since = None
        elif job.held_since is None:
            job.held_since = time.monotonic()
        elif time.monotonic() - job.held_since >= RELEASE_AFTER_S:
            _run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"])
            job.releases += 1
            job.held_since = None
        if job.requeued_at is None and len(rows := _rows(job.folder)) >= REQUEUE_AT_ROWS:
            _run(["scontrol", "requeue", job.job_id])
            job.requeued_at = len(rows)
        if not queued:
            return
        time.sleep(0.5)
    pytest.fail(f"jobs still queued or running after {WATCH_S} s: {[j.job_id for j in jobs.values()]}")


def _story(job: Job) -> str:
    attempts = _run(["sacct", "-D", "-X", "-P", "-j", job.job_id, "-o", "JobID,State,ExitCode,Start,End,NodeList"])
    return f"{attempts}\n--- stderr ---\n{job.logs.get(f'{job.job_id}_0_log.err', '')[-3000:]}"


@pytest.mark.timeout(WATCH_S + 180)
def test_a_requeued_grpo_run_resumes_exactly_and_completes(jobs):
    job, reference = jobs["requeued"], jobs["uninterrupted"]
    assert reference.state == "COMPLETED", _story(reference)
    assert job.state == "COMPLETED", _story(job)
    assert job.requeued_at is not None and job.requeued_at < STEPS and job.releases >= 1
    rows, expected = _rows(job.folder), _rows(reference.folder)
    assert [r["step"] for r in rows] == list(range(STEPS)), "every step exactly once"
    assert [r["phase"] for r in rows] == ["sft"] + ["grpo"] * (STEPS - 1)
    results = [json.loads((job.folder / "results" / f"rank-{r:05d}.json").read_text()) for r in range(2)]
    assert all(r["ok"] and r["steps"] == STEPS for r in results), results
    resumed = results[0]["resumed_step"]
    assert REQUEUE_AT_ROWS <= resumed < STEPS, "the second attempt continued from a checkpoint, not from step 0"
    assert "preempted (SIGTERM)" in job.logs.get(f"{job.job_id}_1_log.out", ""), "the requeue's SIGTERM reached it"
    assert without_timing(rows) == without_timing(expected), "the requeued run equals the uninterrupted one"
