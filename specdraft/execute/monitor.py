"""Watching a launched run: its state now (through its executor, bounded), failures, logs, cancel, metrics.

Every file of a run folder is read through execute.runfiles (regular files only, no link, bounded), and every state
change an executor observes is written to run.json here, so `status`, `runs` and `launch` agree.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path
from typing import Callable, Iterator

from specdraft.errors import UserError
from specdraft.execute import diskspace
from specdraft.execute import executor as executors
from specdraft.execute.executor import Observation, Progress, ProgressFn
from specdraft.execute.report import failure_message, read_results, root_cause
from specdraft.runs import checkpoints
from specdraft.runs import files as runfiles
from specdraft.runs.record import RunRecord, read_record
from specdraft.runs.rundir import ACTIVE, TERMINAL, check_run_dir

FAILED_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "LOST"})
MAX_PLAN_BYTES = 256 * 2**20  # as assemble.read_plan: a 131,072-GPU plan is about 25 MB
MAX_METRICS_BYTES = 64 << 20  # the newest 64 MiB of metrics.jsonl: about 200,000 steps
FOLLOW_CHUNK = 1 << 20  # what `logs --follow` reads from one file per poll
UNANSWERED_LIMIT = 3  # `logs --follow` gives up after this many state checks in a row without an answer


def read_plan(run_dir: str | Path):
    """The run's plan.json (a regular file, no link), parsed and verified against what this specdraft compiles."""
    from specdraft.assemble import parse_plan, verify

    source = str(Path(run_dir) / "plan.json")
    text = runfiles.read_text(run_dir, "plan.json", MAX_PLAN_BYTES)
    if text is None:
        raise UserError(f"{source} is missing", "the run folder is incomplete; relaunch the layout")
    return verify(parse_plan(text, source), source)


def _record_change(run_dir: str | Path, record: RunRecord, seen: Observation) -> RunRecord:
    changes: dict = {}
    attempt: dict = {}
    if seen.job_id and seen.job_id != record.job_id:
        changes["job_id"] = attempt["job_id"] = seen.job_id
    if seen.state != record.state:
        changes["state"] = attempt["state"] = seen.state
    if not changes:
        return record
    if seen.note:
        changes["message"] = seen.note
    return diskspace.update_or_show(record, run_dir, attempt=attempt, **changes)  # a full disk stops no `status`


def observe(run_dir: str | Path, record: RunRecord, *, launching: bool = False) -> tuple[str, RunRecord]:
    """(state now, record as updated); the executor's queries are bounded."""
    state, record, _ = current_state(run_dir, record, launching=launching)
    return state, record


def current_state(
    run_dir: str | Path, record: RunRecord, *, launching: bool = False
) -> tuple[str, RunRecord, Observation]:
    """(state, record, observation) now; run.json is updated when the executor knows better."""
    seen = _settle(run_dir, record, executors.get(record.executor).observe(Path(run_dir), record, launching=launching))
    return seen.state, _record_change(run_dir, record, seen), seen


def _settle(run_dir: str | Path, record: RunRecord, seen: Observation) -> Observation:
    """A job that ended FAILED only because every rank stopped at a checkpoint (exit 75: Slurm preempted it or
    warned of its time limit, and it could not requeue itself again) is PREEMPTED: resumable, not broken."""
    if seen.state != "FAILED":
        return seen
    if record.state == "PREEMPTED":  # settled before: no need to read every result again
        return dataclasses.replace(seen, state="PREEMPTED")
    if stopped_at(read_results(run_dir, record.world_size), record.world_size) is not None:
        return dataclasses.replace(seen, state="PREEMPTED", note="every rank stopped at a checkpoint")
    return seen


def refresh_all(runs: list[tuple[Path, RunRecord]]) -> dict[Path, RunRecord]:
    """Today's state of every run still active, with one batch of queries per executor; returns updated records."""
    by_executor: dict[str, list[tuple[Path, RunRecord]]] = {}
    for folder, record in runs:
        if record.state in ACTIVE:
            by_executor.setdefault(record.executor, []).append((folder, record))
    out = {}
    for name, group in by_executor.items():
        records = dict(group)
        for folder, seen in executors.get(name).observe_many(group).items():
            out[folder] = _record_change(folder, records[folder], _settle(folder, records[folder], seen))
    return out


def log_paths(run_dir: str | Path, record: RunRecord, rank: int) -> tuple[str, str]:
    """(stdout, stderr) of one rank, relative to the run folder."""
    return executors.get(record.executor).log_paths(record, rank)


def problem(run_dir: str | Path, record: RunRecord, state: str, plan) -> str | None:
    """A clear account of why the run did not succeed, or None when it did (or is still going)."""
    job = f"job {record.job_id}" if record.job_id else "the run"
    results = read_results(run_dir, plan.world_size)
    stopped = stopped_at(results, plan.world_size)
    if state == "CANCELLED":
        return f"{job} was cancelled ({len(results)} of {plan.world_size} ranks left a result)" + _resumable(
            run_dir, stopped
        )
    if state in ("TIMEOUT", "DEADLINE"):
        return (
            f"{job} hit its time limit (slurm.time = {plan.slurm.time}); raise slurm.time in the "
            "layout, or run fewer --steps" + _resumable(run_dir, stopped)
        )
    if state == "PREEMPTED":
        if stopped is None:
            return f"{job} was preempted before every rank stopped at a checkpoint" + _resumable(run_dir, None)
        requeue = stopped.get("requeue") or {}
        on_slurm = bool(results[0].get("slurm_job_id"))  # off Slurm there is nothing to requeue: no need to say so
        why = f"; not requeued: {requeue.get('reason')}" if on_slurm and requeue.get("requeued") is False else ""
        return f"{job} was preempted ({stopped['signal']}){why}" + _resumable(run_dir, stopped)
    if state == "SUBMIT_FAILED":
        return f"sbatch refused the job: {record.message}"
    if state in ACTIVE:
        return None
    failed = [r for r, rec in results.items() if not rec.get("ok")]
    if state not in FAILED_STATES and not failed and (state != "COMPLETED" or len(results) == plan.world_size):
        return None
    rank = root_cause(results, list(record.exit_order))
    if rank is None and len(results) < plan.world_size:
        # No rank recorded a failure: the first rank that left no result line at all (killed, out of memory, or
        # dead before it could write one); its stderr is the evidence.
        rank = min(set(range(plan.world_size)) - set(results))
    what = f"{job} {state}" if state in FAILED_STATES else f"{job} ended {state} but not every rank passed"
    if record.message and state in FAILED_STATES:  # what the launcher or an observer recorded: a full disk, say
        what = f"{what} ({record.message})"
    stderr = log_paths(run_dir, record, rank)[1] if rank is not None else None
    return failure_message(plan, results, rank, run_dir, stderr, what)


def stopped_at(results: dict[int, dict], world_size: int) -> dict | None:
    """Rank 0's "preempted" record ({signal, step, checkpoint, requeue}) when every rank stopped at a checkpoint."""
    if len(results) != world_size or not all(isinstance(r.get("preempted"), dict) for r in results.values()):
        return None
    return results[0]["preempted"]


def resume_command(run_dir: str | Path) -> str:
    """The launch that continues this run folder from its newest complete checkpoint."""
    return (
        f"specdraft launch {shlex.quote(str(Path(run_dir) / 'plan.json'))} --run-dir "
        f"{shlex.quote(str(run_dir))} --resume"
    )


def _resumable(run_dir: str | Path, stopped: dict | None) -> str:
    """What a resume would continue from (nothing when there is no complete checkpoint)."""
    if stopped is not None:
        return (
            f"; it stopped at a checkpoint after step {stopped['step']} ({stopped['checkpoint']}): "
            f"`{resume_command(run_dir)}` continues it"
        )
    newest = newest_checkpoint(run_dir)
    if newest is None:
        return ""
    return f"; its newest complete checkpoint is {newest[0]}: `{resume_command(run_dir)}` continues from there"


def newest_checkpoint(run_dir: str | Path) -> tuple[str, dict] | None:
    """(folder relative to the run folder, marker) of the newest complete checkpoint, found the way the ranks'
    --resume finds it (plan/checkpoints: marker present and every file of its manifest whole) but read like every
    file of a run folder (no link followed, nothing that can block, bounded); None when there is none."""
    names = runfiles.list_names(run_dir, checkpoints.CHECKPOINTS_DIR)
    steps = sorted(((int(m.group(1)), n) for n in names if (m := checkpoints.STEP_RE.match(n))), reverse=True)
    for _, name in steps:
        rel = f"{checkpoints.CHECKPOINTS_DIR}/{name}"
        try:
            text = runfiles.read_text(run_dir, f"{rel}/{checkpoints.MARKER}", checkpoints.MAX_MARKER_BYTES)
            if text is None:
                continue
            meta = checkpoints.parse_marker(text)
            checkpoints.check_manifest(meta, lambda file: runfiles.size(run_dir, f"{rel}/{file}"))  # noqa: B023
        except (checkpoints.CorruptCheckpoint, UserError, ValueError, OSError):
            continue  # not complete: a resume skips it too
        return rel, meta
    return None


def restarts(record: RunRecord) -> int | None:
    """How often the scheduler restarted the run's job by itself (Slurm requeues); None when not known."""
    return executors.get(record.executor).restarts(record)


def progress_summary(record: RunRecord, state: str, seen: Observation, num_results: int, world_size: int) -> str:
    reason = f" ({seen.reason})" if seen.reason else ""
    return f"{record.describe_job()}: {state}{reason}, {num_results}/{world_size} rank result(s)"


def wait(run_dir: str | Path, timeout_s: float, on_progress: ProgressFn, poll_s: float = 1.0) -> tuple[str, RunRecord]:
    """Poll until the run reaches a terminal state or ``timeout_s`` passes; returns (state, record)."""
    started = time.monotonic()
    last = None
    while True:
        record = read_record(run_dir)
        if record is None:
            raise UserError(f"{run_dir}/run.json vanished while waiting", "another program removed it")
        state, record, seen = current_state(run_dir, record)
        summary = progress_summary(
            record, state, seen, len(read_results(run_dir, record.world_size)), record.world_size
        )
        if summary != last:
            on_progress(Progress(record.executor, time.monotonic() - started, state, summary))
            last = summary
        if state in TERMINAL:
            return state, record
        if seen.gone:
            raise UserError(
                f"Slurm no longer knows {record.describe_job()} (last recorded state {state})",
                f"`specdraft status {run_dir}` shows what the ranks left",
            )
        if time.monotonic() - started > timeout_s:
            raise UserError(
                f"gave up waiting after {timeout_s:.0f} s; the job is still {state}",
                f"it keeps running: `specdraft status {run_dir}`",
            )
        time.sleep(poll_s)


def follow(
    run_dir: str | Path,
    paths: list[tuple[str, str]],
    done: Callable[[], str | None],
    poll_s: float = 0.5,
    state_every_s: float = 2.0,
) -> Iterator[tuple[str, str]]:
    """Yield (label, new text) from growing files (paths relative to the run folder) until ``done()`` returns a
    reason to stop (checked every ``state_every_s``), then drain once; a final ("", reason) says why it stopped."""
    offsets = {rel: 0 for _, rel in paths}
    next_check = 0.0
    reason = None
    while True:
        for label, rel in paths:
            got = runfiles.read_range(run_dir, rel, offsets[rel], FOLLOW_CHUNK)
            if got is None:
                continue
            data, size = got
            if size < offsets[rel]:  # truncated or replaced: start again from its beginning
                offsets[rel] = 0
                continue
            if data:
                offsets[rel] += len(data)
                yield label, data.decode("utf-8", errors="replace")
        if reason is not None:
            yield "", reason
            return
        now = time.monotonic()
        if now >= next_check:
            reason = done()
            next_check = now + state_every_s
        if reason is None:
            time.sleep(poll_s)


def follow_until(run_dir: str | Path) -> Callable[[], str | None]:
    """`done()` for `follow`: the run ended, its scheduler forgot it, or the scheduler stopped answering."""
    unanswered = {"n": 0}

    def done() -> str | None:
        record = read_record(run_dir)
        if record is None:
            return "run.json vanished"
        state, record, seen = current_state(run_dir, record)
        if state in TERMINAL:
            return f"the run ended: {state}"
        if seen.gone:
            return f"stopped following: {seen.source}"
        unanswered["n"] = unanswered["n"] + 1 if "did not answer" in seen.source else 0
        if unanswered["n"] >= UNANSWERED_LIMIT:
            return f"stopped following: {seen.source} {UNANSWERED_LIMIT} times in a row"
        return None

    return done


def cancel(run_dir: str | Path, record: RunRecord) -> str:
    """Cancel the run; returns a one-line account. run.json gets cancel_requested, then the new state."""
    check_run_dir(run_dir)
    state, record = observe(run_dir, record)
    if state in TERMINAL:
        return f"nothing to cancel: the run already ended ({state})"
    record = diskspace.update(run_dir, cancel_requested=True)
    message, final = executors.get(record.executor).cancel(Path(run_dir), record)
    if final:
        diskspace.update(run_dir, state=final, attempt={"state": final})
    return message


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every complete line of RUN/metrics.jsonl (the newest MAX_METRICS_BYTES of it), one per step; a line still
    being written is skipped, not an error."""
    got = runfiles.read_range(run_dir, "metrics.jsonl", -MAX_METRICS_BYTES, MAX_METRICS_BYTES)
    if got is None:
        return []
    data, size = got
    lines = data.split(b"\n")
    if size > len(data):
        lines = lines[1:]  # the first line was cut by the bound
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            break
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows


def metrics_summary(run_dir: str | Path) -> tuple[int, dict] | None:
    """(steps logged, the last step's metrics), or None before the first step."""
    rows = read_metrics(run_dir)
    return (len(rows), rows[-1]) if rows else None
