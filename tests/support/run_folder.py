"""A whole run folder made without ranks, the way a finished local co-training run leaves it: plan.json, run.json
(local executor, COMPLETED), a result per rank, metrics.jsonl and one checkpoint (tests/support/checkpoints.py).
`status` reads every one of them, so hostile edits of any file can be tried against the real CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

from specdraft.runs.record import Attempt, new_record
from specdraft.runs.rundir import claim_run_dir, replace_record
from tests.support.checkpoints import fake_checkpoint

STEPS = 4


def metrics_row(step: int) -> dict:
    return {
        "step": step,
        "target_loss": 4.0 - step / 10,
        "draft_loss": 5.0 - step / 10,
        "acceptance": [0.5, 0.25, 0.125],
        "accept_len": 1.875,
        "tap_bytes": 4096,
        "step_time_s": 0.5,
    }


def result_record(rank: int) -> dict:
    return {
        "global_rank": rank,
        "ok": True,
        "terminated": False,
        "error": None,
        "checks": [{"name": "steps", "value": STEPS, "expected": STEPS, "passed": True}],
        "hostname": "node0",
        "started_at": 1.0,
        "finished_at": 2.0,
        "slurm_job_id": None,
    }


def preempted_record(rank: int, folder: Path) -> dict:
    """The result of a rank that saved and stopped on a signal."""
    stopped = {
        "signal": "SIGUSR2",
        "step": STEPS,
        "checkpoint": str(folder / "checkpoints" / f"step-{STEPS}"),
        "requeue": {"requeued": False, "reason": "not running under Slurm (no SLURM_JOB_ID)", "restarts": 0},
    }
    return {**result_record(rank), "ok": False, "terminated": True, "preempted": stopped}


def make_run_folder(folder: Path, plan) -> Path:
    claim_run_dir(folder)
    (folder / "plan.json").write_text(plan.to_json())
    replace_record(
        folder,
        new_record(
            name=plan.name,
            run_dir=str(folder),
            executor="local",
            job_id="local-4242",
            job_name=plan.run_name,
            state="COMPLETED",
            intent_epoch=time.time(),
            plan_hash=plan.plan_hash,
            spec_sha256=plan.spec_sha256,
            specdraft_version=plan.specdraft_version,
            world_size=plan.world_size,
            workload="cotrain",
            steps=STEPS,
            attempts=(Attempt(attempt=1, executor="local", job_id="local-4242", state="COMPLETED", intent="x"),),
        ),
    )
    (folder / "results").mkdir()
    for rank in range(plan.world_size):
        (folder / "results" / f"rank-{rank:05d}.json").write_text(json.dumps(result_record(rank)))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(metrics_row(s)) + "\n" for s in range(STEPS)))
    fake_checkpoint(folder / "checkpoints" / f"step-{STEPS}", plan, STEPS)
    return folder
