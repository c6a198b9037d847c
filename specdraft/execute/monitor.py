"""Watching a launched run: its state now (bounded Slurm queries), per-rank progress, failures, logs, cancel."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Iterator

from specdraft.errors import UserError
from specdraft.execute.report import failure_message, read_results, root_cause
from specdraft.execute.rundir import ACTIVE, TERMINAL, lock_is_held, read_record, update_record

FAILED_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "LOST"})


def read_plan(run_dir: str | Path):
    """The run's plan.json, parsed and verified against what this specdraft compiles (assemble.read_plan)."""
    from specdraft.assemble import read_plan as read_verified

    return read_verified(Path(run_dir) / "plan.json")


def current_state(run_dir: str | Path, record: dict) -> tuple[str, dict]:
    """(state, info) now; refreshes run.json when Slurm knows better. Never blocks longer than the query bound."""
    state = record.get("state", "UNKNOWN")
    info: dict = {"source": "run.json"}
    if record.get("executor") == "slurm":
        from specdraft.execute import slurm

        if state == "SUBMITTING":
            jobs = slurm.find_jobs(record.get("job_name", ""), record.get("intent_epoch", 0.0))
            if jobs:
                job_id, found = jobs[-1]
                record = update_record(run_dir, job_id=job_id, state=found, attempt={"job_id": job_id,
                                       "state": found}, message=f"recovered job {job_id} by name")
        job_id = record.get("job_id")
        if job_id:
            info = slurm.job_states([job_id]).get(job_id) or {"source": "run.json (sacct/squeue did not answer)"}
            if "State" in info and info["State"] != record.get("state"):
                state = info["State"]
                update_record(run_dir, state=state, attempt={"state": state})
            else:
                state = record.get("state", state)
    elif state in ACTIVE and not lock_is_held(run_dir):
        from specdraft.execute.local import group_members

        pgid = (record.get("local") or {}).get("pgid")
        if pgid and group_members(pgid, str(Path(run_dir) / "plan.json")):
            info = {"source": "run.json (its launcher is gone, its ranks still run; `specdraft cancel` stops them)"}
        else:
            info = {"source": "run.json (its launcher is gone)"}
            state = "LOST"
    return state, info


def log_paths(run_dir: str | Path, record: dict, rank: int) -> tuple[Path, Path]:
    """(stdout, stderr) of one rank: submitit's per-task logs for Slurm, logs/rank-N.* for local."""
    if record.get("executor") == "slurm":
        from specdraft.execute.slurm import task_log

        folder = Path(run_dir) / "submitit"
        job_id = record.get("job_id") or "none"
        return task_log(folder, job_id, rank, "out"), task_log(folder, job_id, rank, "err")
    logs = Path(run_dir) / "logs"
    return logs / f"rank-{rank}.out", logs / f"rank-{rank}.err"


def problem(run_dir: str | Path, record: dict, state: str) -> str | None:
    """A clear account of why the run did not succeed, or None when it did (or is still going)."""
    plan = read_plan(run_dir)
    job = f"job {record.get('job_id')}" if record.get("job_id") else "the run"
    results = read_results(run_dir)
    if state == "CANCELLED":
        return f"{job} was cancelled ({len(results)} of {plan.world_size} ranks left a result)"
    if state in ("TIMEOUT", "DEADLINE"):
        return (f"{job} hit its time limit (slurm.time = {plan.spec.slurm.time}); raise slurm.time in the "
                "layout, or run fewer --steps")
    if state == "SUBMIT_FAILED":
        return f"sbatch refused the job: {record.get('message')}"
    if state in ACTIVE:
        return None
    failed = [r for r, rec in results.items() if not rec.get("ok")]
    if state not in FAILED_STATES and not failed and (state != "COMPLETED" or len(results) == plan.world_size):
        return None
    rank = root_cause(results, record.get("exit_order"))
    trace = None
    if record.get("executor") == "slurm" and record.get("job_id"):
        from specdraft.execute.slurm import task_traces

        traces = task_traces(Path(run_dir) / "submitit", record["job_id"], plan.world_size)
        if rank is None and traces:
            rank = min(traces)
        trace = traces.get(rank) if rank is not None else None
    what = f"{job} {state}" if state in FAILED_STATES else f"{job} ended {state} but not every rank passed"
    return failure_message(plan, results, rank, log_paths(run_dir, record, rank)[1] if rank is not None else None,
                           what, trace)


def wait(run_dir: str | Path, timeout_s: float, on_poll: Callable[[str, int], None],
         poll_s: float = 1.0) -> tuple[str, dict]:
    """Poll until the run reaches a terminal state or ``timeout_s`` passes; returns (state, record)."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = read_record(run_dir) or {}
        state, _ = current_state(run_dir, record)
        on_poll(state, len(read_results(run_dir)))
        if state in TERMINAL:
            return state, read_record(run_dir) or record
        if time.monotonic() > deadline:
            raise UserError(f"gave up waiting after {timeout_s:.0f} s; the job is still {state}",
                            f"it keeps running: `specdraft status {run_dir}`")
        time.sleep(poll_s)


def follow(paths: list[tuple[str, Path]], done: Callable[[], bool], poll_s: float = 0.5,
           state_every_s: float = 2.0, timeout_s: float | None = None) -> Iterator[tuple[str, str]]:
    """Yield (label, new text) from growing files until ``done()`` (checked every ``state_every_s``), then drain."""
    offsets = {path: 0 for _, path in paths}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    next_check = 0.0
    finished = False
    while True:
        for label, path in paths:
            try:
                with open(path, "rb") as handle:
                    handle.seek(offsets[path])
                    data = handle.read()
            except OSError:
                continue
            if data:
                offsets[path] += len(data)
                yield label, data.decode("utf-8", errors="replace")
        if finished:
            return
        now = time.monotonic()
        if now >= next_check:
            finished = done() or (deadline is not None and now > deadline)
            next_check = now + state_every_s
        if not finished:
            time.sleep(poll_s)


def cancel(run_dir: str | Path, record: dict) -> str:
    """Cancel the run; returns a one-line account. run.json gets cancel_requested, then the new state."""
    state, _ = current_state(run_dir, record)
    if state in TERMINAL:
        return f"nothing to cancel: the run already ended ({state})"
    update_record(run_dir, cancel_requested=True)
    if record.get("executor") == "slurm":
        import subprocess

        from specdraft.execute import slurm

        if not record.get("job_id"):
            raise UserError(f"{run_dir} has no job id yet (state {state})",
                            "run `specdraft status` first; it looks an interrupted submission up by name")
        try:
            slurm.cancel(Path(run_dir) / "submitit", record["job_id"], int(record.get("world_size") or 1))
        except subprocess.CalledProcessError as err:
            raise UserError(f"scancel {record['job_id']} failed (exit {err.returncode})",
                            "see scancel's message above; `squeue -j JOBID` shows the job") from None
        update_record(run_dir, state="CANCELLED", attempt={"state": "CANCELLED"})
        return f"cancelled Slurm job {record['job_id']}"
    from specdraft.execute import local

    pgid = (record.get("local") or {}).get("pgid")
    killed = local.cancel(pgid, str(Path(run_dir) / "plan.json")) if pgid else 0
    if not lock_is_held(run_dir):  # no launcher left to record the outcome: record it here
        update_record(run_dir, state="CANCELLED", attempt={"state": "CANCELLED"})
    return f"cancelled the local run: stopped {killed} rank process(es) of group {pgid}"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Every complete line of RUN/metrics.jsonl (one per step, written by training workloads); a line still being
    written is skipped, not an error."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def metrics_summary(run_dir: str | Path) -> tuple[int, dict] | None:
    """(steps logged, the last step's metrics), or None before the first step."""
    rows = read_metrics(run_dir)
    return (len(rows), rows[-1]) if rows else None
