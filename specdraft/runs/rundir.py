"""Run folders `runs/<name>-<plan hash 8>/`: naming, the marker that makes one specdraft's, locks, updates, lookup.

A folder is a run folder only if specdraft created it (or found it empty) and wrote `.specdraft-run` into it; nothing
in any other folder is read for status or touched by launch, cancel or an update. The names inside: runs/paths.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

from specdraft.errors import UserError
from specdraft.fsutil import atomic_write_text
from specdraft.runs import files as runfiles
from specdraft.runs.paths import LAUNCH_LOCK, RECORD, RECORD_LOCK
from specdraft.runs.paths import RUN_MARKER as MARKER
from specdraft.runs.record import RunRecord, read_record, write_record

RUNS_DIR = "runs"
MARKER_TEXT = "This folder is a specdraft run folder (docs/launch.md); specdraft touches no folder without this file.\n"
# Slurm's terminal states (sacct(1) JOB STATE CODES) plus ours: SUBMIT_FAILED (sbatch said no: nothing exists).
TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SUBMIT_FAILED",
        "LOST",
    }
)
# SUBMITTING: intent written, sbatch's answer not yet recorded; the job may or may not exist.
ACTIVE = frozenset(
    {
        "SUBMITTING",
        "STARTING",
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "COMPLETING",
        "CONFIGURING",
        "SUSPENDED",
        "RESIZING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f%]")


def run_dir_for(plan, explicit: str | None = None) -> str:
    """The run folder's absolute, normalised path (not created): --run-dir DIR, else ./runs/<name>-<hash8>."""
    path = os.path.abspath(explicit if explicit else os.path.join(RUNS_DIR, plan.run_name))
    if UNSAFE_PATH.search(path):
        raise UserError(
            f"the run folder path {path!r} contains a control character or '%'",
            "Slurm expands '%' in log paths and scripts cannot carry line breaks in paths; "
            "pick another --run-dir (or run from another directory)",
        )
    return path


def is_run_dir(folder: str | Path) -> bool:
    """True when ``folder`` carries specdraft's marker (a regular file, not a link, with the marker's text)."""
    try:
        return runfiles.read_text(folder, MARKER, 4096) == MARKER_TEXT
    except (OSError, UserError):
        return False


def check_run_dir(folder: str | Path) -> Path:
    """``folder`` if it is a specdraft run folder; a UserError naming it otherwise. Called before anything in it
    is read for status or touched."""
    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"{path} is not a folder", "give a run folder's path or a name from `specdraft runs`")
    if not is_run_dir(path):
        raise UserError(
            f"{path} is not a specdraft run folder (it has no {MARKER} marker), so specdraft leaves it alone",
            "name a folder `specdraft launch` created (see `specdraft runs`); folders made by "
            "specdraft before the marker existed must be relaunched into a new folder",
        )
    return path


def refuse_foreign(folder: str | Path) -> None:
    """Refuse, by name, a folder that exists and is neither a run folder nor empty; reads only its listing."""
    path = Path(folder)
    if path.is_symlink() and not path.exists():
        raise UserError(f"the run folder {path} is a dangling link", "choose another --run-dir")
    if not path.exists() or (path.is_dir() and is_run_dir(path)):
        return
    if not path.is_dir():
        raise UserError(f"the run folder {path} exists and is not a folder", "choose another --run-dir")
    entries = sorted(os.listdir(path))
    if entries:
        shown = ", ".join(entries[:6]) + (f" and {len(entries) - 6} more" if len(entries) > 6 else "")
        raise UserError(
            f"{path} is not a specdraft run folder (no {MARKER} marker) and holds files ({shown}); "
            "specdraft does not write into it",
            "choose a new or empty --run-dir (the default, runs/<name>-<hash8>, is always specdraft's)",
        )


def claim_run_dir(folder: str | Path) -> Path:
    """Create the run folder with its marker, adopt an empty folder, or accept an existing run folder; refuse any
    other folder by name, before anything in it is touched."""
    path = Path(folder)
    refuse_foreign(path)
    if not is_run_dir(path):
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / MARKER, MARKER_TEXT)
    return path


@contextlib.contextmanager
def _flock(folder: str | Path, name: str, blocking: bool):
    fd = runfiles.open_lock(folder, name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def update_record(folder: str | Path, /, *, attempt: dict | None = None, **changes) -> RunRecord:
    """Apply ``changes`` (and ``attempt`` to the last attempt) to run.json atomically; returns the new record.

    Serialised by the record lock, so a `cancel` and the launcher finishing at the same time cannot lose a write.
    """
    check_run_dir(folder)
    with _flock(folder, RECORD_LOCK, blocking=True):
        record = read_record(folder)
        if record is None:
            raise UserError(
                f"{Path(folder) / RECORD} vanished while specdraft was updating it",
                "another program removed it; relaunch with --force",
            )
        record = dataclasses.replace(record, **changes)
        if attempt and record.attempts:
            last = dataclasses.replace(record.attempts[-1], **attempt)
            record = dataclasses.replace(record, attempts=(*record.attempts[:-1], last))
        return write_record(folder, record)


def replace_record(folder: str | Path, record: RunRecord) -> RunRecord:
    """Write a whole new record (the launch's intent) under the record lock."""
    check_run_dir(folder)
    with _flock(folder, RECORD_LOCK, blocking=True):
        return write_record(folder, record)


@contextlib.contextmanager
def launch_lock(run_dir: str | Path):
    """Exclusive, non-blocking: a second `specdraft launch` of the same run folder stops at once."""
    fd = runfiles.open_lock(run_dir, LAUNCH_LOCK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UserError(
                f"another `specdraft launch` (pid {holder[:12]}) is launching or running {run_dir} now",
                "wait for it to finish, or follow it with `specdraft status` / `specdraft logs`",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def lock_is_held(run_dir: str | Path) -> bool:
    """True while some process holds the launch lock (a local run's launcher holds it for the whole run)."""
    try:
        fd = runfiles.open_file(run_dir, LAUNCH_LOCK, os.O_RDONLY)
    except (FileNotFoundError, UserError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass(frozen=True)
class RunEntry:
    """One folder under runs/: its record, or why it cannot be read (shown as a broken row, never fatal)."""

    folder: Path
    record: RunRecord | None
    problem: str | None = None


def list_runs(root: str | Path = RUNS_DIR) -> list[RunEntry]:
    """Every run folder under ``root`` (and every folder there that holds a run.json), newest first; one that
    cannot be read is listed with the reason instead of failing the whole listing."""
    out: list[RunEntry] = []
    base = Path(root)
    if not base.is_dir():
        return out
    for child in base.iterdir():
        if child.is_symlink() or not child.is_dir():
            continue
        marked = is_run_dir(child)
        if not marked and not (child / RECORD).exists() and not (child / RECORD).is_symlink():
            continue
        try:
            if not marked:
                check_run_dir(child)
            record = read_record(child)
        except UserError as err:
            out.append(RunEntry(child.absolute(), None, err.message))
            continue
        if record is None:
            out.append(RunEntry(child.absolute(), None, "no run.json yet (a launch stopped before its intent)"))
        else:
            out.append(RunEntry(child.absolute(), record))
    out.sort(
        key=lambda e: (e.record is not None, e.record.submitted or e.record.updated if e.record else "", e.folder.name),
        reverse=True,
    )
    return out


def resolve_run(arg: str | None, root: str | Path = RUNS_DIR) -> tuple[Path, RunRecord, list[RunEntry]]:
    """RUN is a run folder's path or its name under runs/; None is the most recent readable run. Returns the
    folder, its record, and the folders under ``root`` that could not be read (None given only)."""
    if arg is None:
        runs = list_runs(root)
        good = [(e.folder, e.record) for e in runs if e.record is not None]
        if not good:
            broken = f" ({len(runs)} unreadable: see `specdraft runs`)" if runs else ""
            raise UserError(
                f"no readable runs under {os.path.abspath(root)}{broken}",
                "start one with `specdraft launch`, or name a run folder",
            )
        newest_folder, newest = good[0]
        return newest_folder, newest, [e for e in runs if e.record is None]
    candidates = list(dict.fromkeys((Path(arg), Path(root) / arg)))  # an absolute arg is both
    for candidate in candidates:
        if candidate.is_dir() and (is_run_dir(candidate) or (candidate / RECORD).exists()):
            check_run_dir(candidate)
            record = read_record(candidate)
            if record is None:
                raise UserError(
                    f"{candidate} has no run.json yet", "its launch stopped before recording its intent; launch again"
                )
            return candidate.absolute(), record, []
    known = ", ".join(e.folder.name for e in list_runs(root)[:8]) or "none"
    looked = " and ".join(str(c / RECORD) for c in candidates)
    raise UserError(
        f"no run folder {arg!r} (looked for {looked})",
        f"give a run folder path or a name from `specdraft runs` (known: {known})",
    )
