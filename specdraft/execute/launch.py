"""Launching a plan into its run folder: executor choice, relaunch rules, the double-submit protocol."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specdraft.errors import UserError
from specdraft.execute.rundir import ACTIVE, TERMINAL, launch_lock, now_iso, read_record, update_record
from specdraft.fsutil import atomic_write_text
from specdraft.render.sbatch import SbatchRender

# Workloads the runtime entry knows (runtime.entry.WORKLOADS has the module of each; a test keeps the two equal).
WORKLOADS = ("selftest", "cotrain")

# The protocol (docs/launch.md, "Never twice"): under an exclusive flock on RUN/.launch.lock, read run.json and
# refuse if it holds a job (unless --force and that job is over); write plan.json and sbatch.sh; record the intent
# (state SUBMITTING, attempt n) atomically BEFORE sbatch; then record sbatch's answer (the job id, or SUBMIT_FAILED
# when sbatch said no). A crash between the two leaves SUBMITTING on disk: the next launch looks the job up by
# name in sacct/squeue and never submits blindly.


def choose_executor(requested: str | None) -> tuple[str, str]:
    """(executor, why): the requested one, else slurm when `sbatch` is on PATH and the controller answers."""
    if requested is not None:
        if requested not in ("slurm", "local"):
            raise UserError(f"--executor {requested!r} is not an executor", "use --executor slurm or --executor local")
        return requested, "requested"
    if shutil.which("sbatch") is None:
        return "local", "sbatch is not on PATH"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=5, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return "local", "sbatch is on PATH but the Slurm controller did not answer within 5 s"
    if proc.returncode != 0:
        return "local", "sbatch is on PATH but the Slurm controller does not answer"
    return "slurm", "sbatch is on PATH and the controller answers"


def choose_python(plan, explicit: str | None) -> str:
    """--python, else `python` inside a container image, else this interpreter (the venv's, on a shared FS)."""
    if explicit:
        return explicit
    return "python" if plan.spec.slurm.container_image else sys.executable


def _refresh(run_dir: str, record: dict) -> str:
    """The recorded job's state now (bounded queries); the recorded state when it cannot be refreshed."""
    state = record.get("state", "UNKNOWN")
    if record.get("executor") == "slurm" and record.get("job_id") and state not in TERMINAL:
        from specdraft.execute.slurm import job_states

        info = job_states([record["job_id"]]).get(record["job_id"])
        if info:
            state = info["State"]
            update_record(run_dir, state=state, attempt={"state": state})
    elif record.get("executor") == "local" and state in ACTIVE:
        # We hold the launch lock, so the launcher that recorded this state is gone; are its ranks?
        from specdraft.execute.local import group_members

        pgid = (record.get("local") or {}).get("pgid")
        if not (pgid and group_members(pgid, str(Path(run_dir) / "plan.json"))):
            state = "LOST"
            update_record(run_dir, state=state, attempt={"state": state},
                          message="the launcher stopped before recording how its ranks ended")
    return state


def _recover_submitting(run_dir: str, record: dict) -> str:
    """A SUBMITTING record: find the job by name since the intent; record and return its state if found."""
    if record.get("executor") != "slurm":
        return "LOST"
    from specdraft.execute.slurm import find_jobs

    jobs = find_jobs(record["job_name"], record.get("intent_epoch", 0.0))
    if not jobs:
        return "SUBMITTING"
    job_id, state = jobs[-1]
    update_record(run_dir, job_id=job_id, state=state, attempt={"job_id": job_id, "state": state},
                  message=f"recovered job {job_id} by name after an interrupted submission")
    record.update(job_id=job_id, state=state)
    return state


def check_existing(run_dir: str, plan, force: bool) -> int:
    """Apply the relaunch rules to an existing run.json; returns the next attempt number (1 for a fresh folder)."""
    record = read_record(run_dir)
    if record is None:
        return 1
    if record.get("plan_hash") != plan.plan_hash:
        raise UserError(f"{run_dir} holds a run of another plan ({record.get('name')}, plan "
                        f"{str(record.get('plan_hash'))[:8]})", "choose another --run-dir, or remove that folder")
    state = record.get("state", "UNKNOWN")
    if state == "SUBMITTING":
        state = _recover_submitting(run_dir, record)
    else:
        state = _refresh(run_dir, record)
    attempt = len(record.get("attempts", [])) + 1
    job = f"job {record['job_id']}" if record.get("job_id") else "no job id recorded"
    where = f"{run_dir} ({record.get('executor')}, {job}, state {state})"
    if state == "SUBMITTING":
        if not force:
            raise UserError(f"a previous launch into {where} stopped between recording its intent and recording "
                            f"sbatch's answer, and no job named {record.get('job_name')} is visible in sacct/squeue",
                            "check `squeue --me` yourself; if nothing of this plan runs, relaunch with --force")
        return attempt
    if state in ACTIVE:
        raise UserError(f"this plan is already running: {where}",
                        f"follow it with `specdraft status {run_dir}`, or stop it first with "
                        f"`specdraft cancel {run_dir}` (--force does not submit a plan twice at once)")
    if state == "SUBMIT_FAILED":
        return attempt  # sbatch said no: nothing was ever queued, so a retry cannot double-submit
    if not force:
        raise UserError(f"this plan was already launched: {where}, submitted {record.get('submitted')}",
                        f"see `specdraft status {run_dir}`; relaunch it with --force (attempt {attempt}), or "
                        "change the layout (a different plan gets its own run folder)")
    return attempt


def _archive(run_dir: str, attempt: int) -> None:
    """Move the previous attempt's results/ and logs/ to attempts/<n>/ so status shows only the new attempt."""
    for name in ("results", "logs"):
        src = Path(run_dir) / name
        if src.exists():
            dst = Path(run_dir) / "attempts" / str(attempt - 1) / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            src.rename(dst)


def _intent(run_dir: str, plan, executor: str, attempt: int, render: SbatchRender, workload: str,
            steps: int | None, state: str) -> None:
    atomic_write_text(Path(run_dir) / "plan.json", plan.to_json())
    if executor == "slurm":
        atomic_write_text(Path(run_dir) / "sbatch.sh", render.script, mode=0o755)
    previous = read_record(run_dir) or {}
    attempts = list(previous.get("attempts", []))
    attempts.append({"attempt": attempt, "executor": executor, "job_id": None, "state": state,
                     "intent": now_iso()})
    update_record(run_dir, name=plan.name, run_dir=run_dir, executor=executor, job_id=None, job_name=render.job_name,
                  state=state, intent_epoch=time.time(), submitted=None, plan_hash=plan.plan_hash,
                  spec_sha256=plan.spec_sha256, specdraft_version=plan.specdraft_version,
                  world_size=plan.world_size, workload=workload, steps=steps, attempts=attempts, message=None,
                  cancel_requested=False, local=None)


def launch_slurm(plan, run_dir: str, render: SbatchRender, python: str, force: bool, workload: str,
                 steps: int | None) -> dict:
    from specdraft.execute import slurm

    timeout_min = max(1, plan.slurm.time_limit_s // 60)
    try:
        executor = slurm.make_executor(render, python, plan.world_size, timeout_min)
    except slurm.SubmitRefused as err:
        raise UserError(f"cannot submit to Slurm here: {err}", "run on a Slurm login node, or use "
                        "--executor local") from None
    with launch_lock(run_dir):
        attempt = check_existing(run_dir, plan, force)
        if attempt > 1:
            _archive(run_dir, attempt)
        _intent(run_dir, plan, "slurm", attempt, render, workload, steps, "SUBMITTING")
        try:
            job_id = slurm.submit(executor, render)
        except slurm.SubmitRefused as err:
            update_record(run_dir, state="SUBMIT_FAILED", message=str(err), attempt={"state": "SUBMIT_FAILED"})
            raise UserError(f"sbatch refused the job: {err}",
                            "fix the slurm section of the layout (partition, account, qos, time, resources); "
                            "`sinfo` lists partitions") from None
        except slurm.SubmitUnknown as err:
            update_record(run_dir, message=f"submission interrupted: {err}")
            raise UserError(f"the submission of {run_dir} was interrupted after sbatch ran ({err}); the job may "
                            "exist", f"run `specdraft status {run_dir}` (it looks the job up by name) before "
                            "launching again") from None
        return update_record(run_dir, job_id=job_id, state="PENDING", submitted=now_iso(),
                             attempt={"job_id": job_id, "state": "PENDING", "submitted": now_iso()})


def launch_local(plan, run_dir: str, render: SbatchRender, force: bool, workload: str, steps: int | None,
                 python: str, on_progress) -> tuple[dict, object]:
    """Run every rank here and wait; the launch lock is held for the whole run (the launcher is the job)."""
    from specdraft.execute import local

    with launch_lock(run_dir):
        attempt = check_existing(run_dir, plan, force)
        if attempt > 1:
            _archive(run_dir, attempt)
        _intent(run_dir, plan, "local", attempt, render, workload, steps, "STARTING")
        argv = [python, *render.payload_argv[1:]]

        def started(pgid: int, pids: list[int]) -> None:
            update_record(run_dir, job_id=f"local-{pgid}", state="RUNNING", submitted=now_iso(),
                          local={"pgid": pgid, "pids": pids, "launcher_pid": os.getpid()},
                          attempt={"job_id": f"local-{pgid}", "state": "RUNNING", "submitted": now_iso()})

        outcome = local.run(plan, run_dir, argv, plan.slurm.time_limit_s, started,
                            on_progress)
        record = read_record(run_dir) or {}
        if outcome.interrupted or record.get("cancel_requested"):
            state = "CANCELLED"
        elif outcome.timed_out:
            state = "TIMEOUT"
        elif outcome.exit_order or any(code != 0 for code in outcome.exit_codes.values()):
            state = "FAILED"
        else:
            state = "COMPLETED"
        record = update_record(run_dir, state=state, attempt={"state": state, "ended": now_iso()},
                               exit_codes={str(r): c for r, c in sorted(outcome.exit_codes.items())},
                               exit_order=outcome.exit_order, elapsed_s=round(outcome.elapsed_s, 3))
        return record, outcome
