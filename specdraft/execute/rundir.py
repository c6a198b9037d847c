"""Run folders `runs/<name>-<plan hash 8>/`: naming, the atomic run.json record, the launch lock, lookup.

Layout: plan.json, sbatch.sh, submitit/ or logs/, results/rank-NNNNN.json, run.json, .launch.lock, .record.lock.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
from pathlib import Path

from specdraft.errors import UserError
from specdraft.fsutil import atomic_write_text

RUNS_DIR = "runs"
RECORD = "run.json"
# Slurm's terminal states (sacct(1) JOB STATE CODES) plus ours: SUBMIT_FAILED (sbatch said no: nothing exists).
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                      "DEADLINE", "PREEMPTED", "REVOKED", "SUBMIT_FAILED", "LOST"})
# SUBMITTING: intent written, sbatch's answer not yet recorded; the job may or may not exist.
ACTIVE = frozenset({"SUBMITTING", "STARTING", "PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING",
                    "SUSPENDED", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"})
UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f%]")


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_dir_for(plan, explicit: str | None = None) -> str:
    """The run folder's absolute, normalised path (not created): --run-dir DIR, else ./runs/<name>-<hash8>."""
    path = os.path.abspath(explicit if explicit else os.path.join(RUNS_DIR, plan.run_name))
    if UNSAFE_PATH.search(path):
        raise UserError(f"the run folder path {path!r} contains a control character or '%'",
                        "Slurm expands '%' in log paths and scripts cannot carry line breaks in paths; "
                        "pick another --run-dir (or run from another directory)")
    return path


def read_record(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / RECORD
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON ({err})", "repair or remove it (it is written atomically, so "
                        "this means it was edited by hand)") from None
    return data


@contextlib.contextmanager
def _flock(path: Path, blocking: bool):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def update_record(folder: str | Path, /, attempt: dict | None = None, **changes) -> dict:
    """Merge ``changes`` (and ``attempt`` into the last attempt) into run.json atomically; returns the record.

    Serialised by .record.lock, so a `cancel` and the launcher finishing at the same time cannot lose a write.
    """
    with _flock(Path(folder) / ".record.lock", blocking=True):
        record = read_record(folder) or {}
        record.update(changes)
        if attempt:
            attempts = record.setdefault("attempts", [])
            if not attempts:
                attempts.append({})
            attempts[-1].update(attempt)
        record["updated"] = now_iso()
        atomic_write_text(Path(folder) / RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
        return record


@contextlib.contextmanager
def launch_lock(run_dir: str | Path):
    """Exclusive, non-blocking: a second `specdraft launch` of the same run folder stops at once."""
    path = Path(run_dir) / ".launch.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UserError(f"another `specdraft launch` (pid {holder}) is launching or running {run_dir} now",
                            "wait for it to finish, or follow it with `specdraft status` / `specdraft logs`") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def lock_is_held(run_dir: str | Path) -> bool:
    """True while some process holds the launch lock (a local run's launcher holds it for the whole run)."""
    path = Path(run_dir) / ".launch.lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def list_runs(root: str | Path = RUNS_DIR) -> list[tuple[Path, dict]]:
    """(folder, record) of every run folder under ``root``, most recently submitted first."""
    out = []
    base = Path(root)
    if base.is_dir():
        for child in base.iterdir():
            record = read_record(child) if child.is_dir() else None
            if record is not None:
                out.append((child.absolute(), record))
    out.sort(key=lambda item: (item[1].get("submitted") or "", item[0].name), reverse=True)
    return out


def resolve_run(arg: str | None, root: str | Path = RUNS_DIR) -> tuple[Path, dict]:
    """RUN is a run folder's path or its name under runs/; None is the most recent run."""
    if arg is None:
        runs = list_runs(root)
        if not runs:
            raise UserError(f"no runs under {os.path.abspath(root)}", "start one with `specdraft launch`, or name a "
                            "run folder")
        return runs[0]
    for candidate in (Path(arg), Path(root) / arg):
        record = read_record(candidate) if candidate.is_dir() else None
        if record is not None:
            return candidate.absolute(), record
    known = ", ".join(p.name for p, _ in list_runs(root)[:8]) or "none"
    raise UserError(f"no run folder {arg!r} (looked for {arg}/run.json and {Path(root) / arg}/run.json)",
                    f"give a run folder path or a name from `specdraft runs` (known: {known})")
