"""Watching a launched run: its state now (through its executor, bounded), failures, logs, cancel, metrics.

Every file of a run folder is read through execute.runfiles (regular files only, no link, bounded), and every state
change an executor observes is written to run.json here, so `status`, `runs` and `launch` agree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
import time
from pathlib import Path
from typing import Callable, Iterator

from specdraft.errors import SpecError, UserError
from specdraft.execute import diskspace
from specdraft.execute import executor as executors
from specdraft.execute.executor import Observation, Progress, ProgressFn
from specdraft.execute.report import failure_message, read_results, root_cause, settle
from specdraft.runs import checkpoints
from specdraft.runs import files as runfiles
from specdraft.runs.marker import MARKER, CorruptCheckpoint
from specdraft.runs.paths import (
    CHECKPOINTS,
    HASH_CHECK_BYTES,
    MAX_METRICS_BYTES,
    MAX_PLAN_BYTES,
    METRICS,
    PLAN,
    RECORD,
    RunPaths,
    link_note,
)
from specdraft.runs.record import RunRecord, read_record
from specdraft.runs.rundir import ACTIVE, TERMINAL, check_run_dir

FAILED_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "LOST"})
FOLLOW_CHUNK = 1 << 20  # what `logs --follow` reads from one file per poll
UNANSWERED_LIMIT = 3  # `logs --follow` gives up after this many state checks in a row without an answer


def verified_plan(run_dir: str | Path):
    """(plan, sha256 of the bytes read): the run's plan.json (a regular file, no link), parsed and verified against
    what this specdraft compiles. A run folder of another specdraft version is named as such."""
    from specdraft import __version__
    from specdraft.assemble import plan_from_data, verify

    source = str(Path(run_dir) / PLAN)
    data = runfiles.read_bytes(run_dir, PLAN, MAX_PLAN_BYTES)
    if data is None:
        raise UserError(f"{source} is missing", "the run folder is incomplete; relaunch the layout")
    parsed = runfiles.parse_json(data, source)
    try:
        plan = verify(plan_from_data(parsed, source), source)
    except (UserError, SpecError) as err:
        version = parsed.get("specdraft_version") if isinstance(parsed, dict) else None
        if isinstance(version, str) and version != __version__:
            raise UserError(
                f"{source} was written by specdraft {version[:40]}, and this is specdraft {__version__}: "
                f"{getattr(err, 'message', str(err))[:600]}",
                f"use specdraft {version[:40]} for this run folder (status, export, measure, resume), or launch "
                "the layout again with this one",
            ) from None
        raise
    return plan, hashlib.sha256(data).hexdigest()


def read_plan(run_dir: str | Path):
    """The run's plan.json, parsed and verified (verified_plan)."""
    return verified_plan(run_dir)[0]


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
    warned of its time limit, and it could not requeue itself again) is PREEMPTED: resumable, not broken. A job that
    ends COMPLETED is FAILED when a rank left no result or a failed one (report.settle: the results decide, once,
    as the state changes; a state already recorded stands)."""
    if seen.state == "COMPLETED" and record.state != "COMPLETED":
        state, why = settle(seen.state, read_results(run_dir, record.world_size), record.world_size)
        return seen if why is None else dataclasses.replace(seen, state=state, note=why)
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
    return f"specdraft launch {shlex.quote(str(Path(run_dir) / PLAN))} --run-dir {shlex.quote(str(run_dir))} --resume"


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
    --resume finds it (runs/checkpoints: a valid marker, every file of its manifest whole, safe metadata); None
    when there is none."""
    newest, _, _ = checkpoint_report(run_dir)
    return newest


def checkpoint_report(run_dir: str | Path) -> tuple[tuple[str, dict] | None, bool, list[str]]:
    """(newest complete checkpoint as newest_checkpoint gives it, whether its content hashes were checked, what is
    wrong with the newer step folders that do not count: links, damaged files, refused metadata). Nothing below
    the run folder is followed; a half-written folder (no marker yet) is not a problem."""
    paths = RunPaths(run_dir)
    links: list[Path] = []
    try:
        dirs = paths.step_dirs(links)
    except UserError as err:  # checkpoints/ itself is a link
        return None, False, [err.message]
    problems = [f"{link_note(link)}: it does not count" for link in links]
    for _, folder in dirs:
        rel = f"{CHECKPOINTS}/{folder.name}"
        if runfiles.size(folder, MARKER) is None and not (folder / MARKER).is_symlink():
            continue  # no marker: being written, or abandoned by a kill
        try:
            meta = checkpoints.check_checkpoint(folder, hash_limit=HASH_CHECK_BYTES)
            hashed = checkpoints.total_bytes(meta) <= HASH_CHECK_BYTES
        except CorruptCheckpoint as why:
            problems.append(f"{rel} is damaged and does not count: {why}")
            continue
        except (UserError, OSError) as err:
            problems.append(f"{rel} cannot be read: {getattr(err, 'message', None) or err}")
            continue
        return (rel, meta), hashed, problems
    return None, False, problems


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
            raise UserError(f"{Path(run_dir) / RECORD} vanished while waiting", "another program removed it")
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
            return f"{RECORD} vanished"
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
    being written (or anything after a line that is not a JSON object) is skipped, not an error."""
    got = runfiles.read_range(run_dir, METRICS, -MAX_METRICS_BYTES, MAX_METRICS_BYTES)
    if got is None:
        return []
    data, size = got
    lines = data.split(b"\n")
    if size > len(data):
        lines = lines[1:]  # the first line was cut by the bound
    rows = []
    for line in lines:
        try:
            row = runfiles.parse_json(line, METRICS)
        except runfiles.BadRunFile:
            break
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows


def metrics_summary(run_dir: str | Path) -> tuple[int, dict] | None:
    """(steps logged, the last step's metrics), or None before the first step."""
    rows = read_metrics(run_dir)
    return (len(rows), rows[-1]) if rows else None
