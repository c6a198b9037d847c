"""The launch use case: prepare a request, apply the relaunch rules, record the intent, start, wait, decide.

The protocol (docs/launch.md, "Never twice"): under an exclusive flock on RUN/.launch.lock, read run.json and refuse
if it holds a job (unless --force or --resume and that job is over); write plan.json and the executor's files;
record the intent (state SUBMITTING, attempt n) atomically BEFORE sbatch; then record sbatch's answer (the job id,
or SUBMIT_FAILED when sbatch said no). A crash between the two leaves SUBMITTING on disk: the next launch looks
the job up by name in sacct/squeue and never submits blindly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specdraft.datafile import check_file, file_sha256
from specdraft.errors import UserError
from specdraft.execute import diskspace, monitor
from specdraft.execute import executor as executors
from specdraft.execute.executor import Executor, ProgressFn
from specdraft.execute.request import LaunchRequest
from specdraft.execute.starts import check_checkpoint, check_draft_checkpoint, check_grpo, check_reward
from specdraft.fsutil import atomic_write_text
from specdraft.plan.model import LaunchPlan
from specdraft.render.sbatch import render_sbatch
from specdraft.runs import checkpoints
from specdraft.runs.files import is_dir
from specdraft.runs.paths import (
    CHECKPOINTS,
    HASH_CHECK_BYTES,
    LOGS,
    METRICS,
    RESULTS,
    ROLLOUTS,
    WRITTEN_DIRS,
    RunPaths,
)
from specdraft.runs.record import Attempt, RunRecord, new_record, now_iso, read_record
from specdraft.runs.rundir import (
    ACTIVE,
    TERMINAL,
    claim_run_dir,
    is_run_dir,
    launch_lock,
    refuse_foreign,
    replace_record,
    run_dir_for,
)

# Workloads the runtime entry knows (runtime.entry.WORKLOADS has the module of each; a test keeps the two equal).
WORKLOADS = ("selftest", "cotrain", "grpo")
TRAINING_WORKLOADS = ("cotrain", "grpo")  # they train and checkpoint
# How long `--wait` waits beyond the job's own time limit: queueing time before it starts.
QUEUE_GRACE_S = 600
# Slurm holds a requeued job about two minutes (BeginTime) before it may start again.
REQUEUE_HOLD_S = 150


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended: ``ended`` False when it returned with the job queued (Slurm without --wait)."""

    record: RunRecord
    state: str
    ended: bool
    problem: str | None  # why the run did not succeed; None when it did (or has not ended)
    started: str  # one line saying what was started


def prepare(
    plan: LaunchPlan,
    *,
    executor: str | None = None,
    run_dir: str | None = None,
    python: str | None = None,
    workload: str | None = None,
    steps: int | None = None,
    force: bool = False,
    wait: bool = False,
    resume: bool = False,
    resume_from: str | None = None,
    allow_data_change: bool = False,
    dry_run: bool = False,
) -> LaunchRequest:
    """Pick the executor, the run folder and the interpreter, check a resume's checkpoint (and that its data file
    is the one it trained on, unless ``allow_data_change``), and render the script: no side effects. ``workload``
    None: the layout's own (plan.workload). A ``dry_run`` notes what a launch would refuse for want of files (a
    model folder without weights, a hub id) instead of refusing it."""
    workload = workload or plan.workload
    if workload not in WORKLOADS:
        raise UserError(f"--workload {workload!r} is unknown", f"use one of: {', '.join(WORKLOADS)}")
    if steps is not None and steps < 1:
        raise UserError(f"--steps {steps} must be >= 1", "give a positive number of steps")
    if workload in TRAINING_WORKLOADS and plan.training.dtype == "fp8":
        # Refused here, before any allocation: the ranks would refuse it only once the job had started.
        raise UserError(
            "training.dtype = 'fp8': specdraft's co-training runtime builds megatron's local (non-TE) "
            "layers, which have no FP8 GEMMs",
            "launch with training.dtype=bf16; an fp8 layout still "
            "plans and renders for Megatron-LM (`specdraft render --to megatron`)",
        )
    draft_notes: tuple[str, ...] = ()
    if workload in TRAINING_WORKLOADS:
        _, model_notes = check_checkpoint(plan, dry_run)
        draft_notes = (*model_notes, *check_draft_checkpoint(plan))
    if workload == "grpo":
        check_reward(plan)
        check_grpo(plan)
    if workload == "cotrain" and plan.data.path is not None:
        # The file's structure before any allocation; its token lengths need the tokenizer: every rank checks them
        # before its first collective (runtime/train/corpus.py).
        check_file(plan.data.path, plan.data.format, plan.data.tokenizer)
    chosen, why = executors.choose(executor, plan.cluster.executor)
    folder = run_dir_for(plan, run_dir)
    source = os.path.abspath(resume_from) if resume_from is not None else None
    total = steps if steps is not None else plan.training.train_iters
    checkpoint, notes = check_resume(plan, folder, workload, resume, source, total, allow_data_change)
    notes = (*draft_notes, *notes)
    if workload == "cotrain" and not plan.training.packing:
        notes = (
            *notes,
            "training.packing = false: the cotrain runtime packs its rows all the same (only the grpo workload runs "
            "unpacked rows); the field sets the memory plan and the Megatron and NeMo-RL renders",
        )
    interpreter = chosen.default_python(plan, python)
    try:
        render = render_sbatch(
            plan,
            folder,
            python=interpreter,
            workload=workload,
            steps=steps,
            resume=resume,
            resume_from=source,
            allow_data_change=allow_data_change,
        )
    except ValueError as err:
        raise UserError(
            f"cannot render a safe sbatch script: {err}",
            "fix those values in the layout, or move the checkpoint to a path without line breaks",
        ) from None
    return LaunchRequest(
        plan=plan,
        executor=chosen.name,
        executor_why=why,
        run_dir=folder,
        python=interpreter,
        workload=workload,
        steps=steps,
        force=force,
        resume=resume,
        resume_from=source,
        allow_data_change=allow_data_change,
        checkpoint=checkpoint,
        notes=notes,
        waits=wait or chosen.runs_in_launcher,
        render=render,
    )


def check_resume(
    plan: LaunchPlan,
    run_dir: str,
    workload: str,
    resume: bool,
    resume_from: str | None,
    steps: int | None = None,
    allow_data_change: bool = False,
) -> tuple[str | None, tuple[str, ...]]:
    """The checkpoint a --resume / --resume-from launch will continue from, checked as the ranks will check it
    (runs/checkpoints.choose), and the warnings about damaged ones it skips; UserError for a resume that cannot go
    ahead (no checkpoint, another spec's, another model shape, --resume-from at or past ``steps``, a data file
    whose content changed since the checkpoint without ``allow_data_change``), before anything is written or
    submitted."""
    if not resume and resume_from is None:
        return None, ()
    flag = "--resume" if resume else "--resume-from"
    if resume and resume_from is not None:
        raise UserError(
            "--resume and --resume-from exclude each other",
            "--resume continues this run folder; "
            "--resume-from CHECKPOINT starts this plan from another checkpoint: give one of them",
        )
    if workload not in TRAINING_WORKLOADS:
        raise UserError(
            f"{flag} needs --workload cotrain or grpo ({workload} writes no checkpoints)",
            f"drop {flag}, or launch the cotrain workload",
        )
    # Resolved, not compared as strings: a link to the run folder, or '..' in the path, is the same folder.
    if resume_from is not None and RunPaths(run_dir).is_own_checkpoint(resume_from):
        raise UserError(
            f"--resume-from {resume_from} is a checkpoint of this very run folder, which a relaunch "
            "starts over (its checkpoints move to attempts/N/)",
            "continue the run from its newest "
            "checkpoint with --resume, or copy that checkpoint out of the run folder and --resume-from "
            "the copy",
        )
    if resume and os.path.lexists(run_dir) and not is_run_dir(run_dir):
        raise UserError(
            f"--resume: {run_dir} is not a specdraft run folder (it has no .specdraft-run marker), so "
            "specdraft reads nothing in it",
            "give the run folder `specdraft launch` created (see "
            "`specdraft runs`), or start from one of its checkpoints with --resume-from",
        )
    notes: list[str] = []
    try:
        chosen = checkpoints.choose(
            Path(run_dir),
            plan,
            "newest" if resume else "from",
            Path(resume_from) if resume_from else None,
            notes.append,
            steps,
            HASH_CHECK_BYTES,
        )
    except checkpoints.ResumeError as err:
        raise UserError(str(err)) from None
    folder, meta = chosen[0]
    if plan.data.path is not None and workload == "cotrain":
        changed = checkpoints.data_change(meta.get("data"), {"sha256": file_sha256(plan.data.path)})
        if changed is not None and not allow_data_change:
            raise UserError(*checkpoints.data_change_refused(plan.data.path, folder, changed))
        if changed is not None:
            notes.append(
                f"{checkpoints.ALLOW_DATA_CHANGE}: data file {plan.data.path} changed since {folder} was written "
                f"(sha256 {changed[0][:12]} then, {changed[1][:12]} now); the run trains on it from its first sample"
            )
    return str(folder), tuple(notes)


def dry_run_notes(request: LaunchRequest) -> list[str]:
    return executors.get(request.executor).dry_run_notes()


def check_existing(
    run_dir: str, plan: LaunchPlan, force: bool, resume: bool = False, resume_from: str | None = None
) -> int:
    """Apply the relaunch rules to an existing run.json (the caller holds the launch lock); returns the next
    attempt number (1 for a fresh folder). --resume relaunches a run that ended, like --force, but continues it."""
    record = read_record(run_dir)
    if record is None:
        return 1
    if record.plan_hash != plan.plan_hash:
        raise UserError(
            f"{run_dir} holds a run of another plan ({record.name}, plan {record.plan_hash[:8]})",
            "choose another --run-dir, or remove that folder",
        )
    state, record = monitor.observe(run_dir, record, launching=True)
    attempt = len(record.attempts) + 1
    where = f"{run_dir} ({record.executor}, {record.describe_job()}, state {state})"
    if state == "SUBMITTING":
        if not force:
            raise UserError(
                f"a previous launch into {where} stopped between recording its intent and recording "
                f"sbatch's answer, and no job named {record.job_name} is visible in sacct/squeue",
                "check `squeue --me` yourself; if nothing of this plan runs, relaunch with --force",
            )
        return attempt
    if state in ACTIVE:
        raise UserError(
            f"this plan is already running: {where}",
            f"follow it with `specdraft status {run_dir}`, or stop it first with "
            f"`specdraft cancel {run_dir}` (--force does not submit a plan twice at once)",
        )
    if state == "SUBMIT_FAILED":
        return attempt  # sbatch said no: nothing was ever queued, so a retry cannot double-submit
    if not force and not resume:
        start = "from that checkpoint" if resume_from else "from step 0"
        raise UserError(
            f"this plan was already launched: {where}, submitted {record.submitted}",
            f"see `specdraft status {run_dir}`; continue it from its newest checkpoint with --resume, "
            f"start it over {start} with --force (attempt {attempt}; the old checkpoints and metrics "
            "move to attempts/), or change the layout (a different plan gets its own run folder)",
        )
    return attempt


def _check_folders(run_dir: str) -> None:
    """The folders ranks and submitit write into must be real folders: a link there would send their files
    elsewhere."""
    for name in WRITTEN_DIRS:
        if os.path.lexists(Path(run_dir) / name) and not is_dir(run_dir, name):
            raise UserError(
                f"{Path(run_dir) / name} is a link or not a folder; specdraft writes only into real "
                "folders inside a run folder",
                "remove it (specdraft never creates one there)",
            )
    if os.path.islink(Path(run_dir) / METRICS):  # rank 0 appends to it: a link would send the rows elsewhere
        raise UserError(
            f"{Path(run_dir) / METRICS} is a link; specdraft writes only regular files inside a run folder",
            "remove it (specdraft never creates one there)",
        )


def _archive(run_dir: str, attempt: int, resume: bool) -> None:
    """Move the previous attempt's results/ and logs/ to attempts/<n>/ so status shows only the new attempt; a run
    that starts over (not --resume) also moves the old checkpoints and metrics.jsonl there, so neither a later
    --resume nor the new run's metrics can mix in the abandoned history."""
    dst = RunPaths(run_dir).attempt(attempt - 1)
    names = [(RESULTS, True), (LOGS, True)]
    if not resume:  # GRPO's samples go with the metrics: a new run must not append to the old one's steps
        names += [(CHECKPOINTS, True), (METRICS, False), (ROLLOUTS, False)]
    for name, folder in names:
        path = Path(run_dir) / name
        if is_dir(run_dir, name) if folder else (path.is_file() and not path.is_symlink()):
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            path.rename(dst / name)


def _intent(request: LaunchRequest, runner: Executor, attempt: int) -> RunRecord:
    """plan.json, the executor's files, then run.json with the new attempt: all before the job is started."""
    plan, run_dir = request.plan, request.run_dir
    atomic_write_text(RunPaths(run_dir).plan, plan.to_json(), what="plan")
    for name, (text, mode) in runner.intent_files(request).items():
        atomic_write_text(Path(run_dir) / name, text, mode=mode, what=name)
    diskspace.make_reserve(run_dir)  # room to record how the run ended should its disk fill up
    previous = read_record(run_dir)
    attempts = (
        *(previous.attempts if previous else ()),
        Attempt(attempt=attempt, executor=runner.name, job_id=None, state=runner.intent_state, intent=now_iso()),
    )
    return replace_record(
        run_dir,
        new_record(
            name=plan.name,
            run_dir=run_dir,
            executor=runner.name,
            job_name=request.render.job_name,
            state=runner.intent_state,
            intent_epoch=time.time(),
            plan_hash=plan.plan_hash,
            spec_sha256=plan.spec_sha256,
            specdraft_version=plan.specdraft_version,
            world_size=plan.world_size,
            workload=request.workload,
            steps=request.steps,
            attempts=attempts,
        ),
    )


def launch(
    request: LaunchRequest, on_started: Callable[[str], None], on_progress: ProgressFn, warn: Callable[[str], None]
) -> LaunchResult:
    """Run the launch use case for ``request``; raises UserError when it cannot start."""
    runner = executors.get(request.executor)
    refuse_foreign(request.run_dir)  # a folder of the user's is refused whatever the executor
    runner.ready(request, warn)  # e.g. preflight: refused before anything is written
    claim_run_dir(request.run_dir)
    with launch_lock(request.run_dir):
        attempt = check_existing(request.run_dir, request.plan, request.force, request.resume, request.resume_from)
        _check_folders(request.run_dir)
        if attempt > 1:
            _archive(request.run_dir, attempt, request.resume)
        _intent(request, runner, attempt)
        record = runner.start(request, on_progress)
    started = runner.started_summary(record, request.plan)
    on_started(started)
    if not request.waits:
        return LaunchResult(record, record.state, False, None, started)
    state = record.state
    if state not in TERMINAL:
        # Every attempt the job may requeue itself into can use its whole time limit, after Slurm's hold.
        attempts = request.plan.slurm.max_requeues + 1
        budget = attempts * (request.plan.slurm.time_limit_s + REQUEUE_HOLD_S) + QUEUE_GRACE_S
        state, record = monitor.wait(request.run_dir, budget, on_progress)
    plan = monitor.read_plan(request.run_dir)
    return LaunchResult(record, state, True, monitor.problem(request.run_dir, record, state, plan), started)
