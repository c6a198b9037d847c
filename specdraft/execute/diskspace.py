"""Recording a run whose disk filled up: a reserve file written at launch and given back to write run.json.

When the run folder's filesystem fills during a checkpoint, the ranks die (their result files and logs cannot be
written either) and run.json would stay RUNNING: its atomic rewrite needs room for a temp copy. The launch writes
RESERVE (incompressible bytes, so no filesystem stores it as nothing); an update of run.json that fails for a full
disk removes it and writes again, saying what happened. `status` updates run.json the same way, and when even that
fails it shows the state it found without recording it.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

from specdraft.errors import file_error
from specdraft.runs import files as runfiles
from specdraft.runs.paths import RESERVE
from specdraft.runs.record import RunRecord
from specdraft.runs.rundir import update_record

RESERVE_BYTES = 256 << 10  # run.json and its temp copy (a record with 100 attempts is about 30 KB), and a lock
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
LOW_BYTES = 1 << 20  # free space below this after ranks failed: the disk is the likely cause


def make_reserve(run_dir: str | Path) -> None:
    """Write the reserve (kept if it is there already); a disk too full for it fails the launch here, by name."""
    if runfiles.size(run_dir, RESERVE) == RESERVE_BYTES:
        return
    path = Path(run_dir) / RESERVE
    try:
        fd = runfiles.open_file(run_dir, RESERVE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, os.urandom(RESERVE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        release(run_dir)
        user = file_error(err, path, "write the run folder's reserve")
        if user is None:
            raise
        raise user from None


def release(run_dir: str | Path) -> bool:
    """Remove the reserve; True when there was one to give back."""
    try:
        os.unlink(Path(run_dir) / RESERVE)
    except FileNotFoundError:
        return False
    return True


def full_disk_note(run_dir: str | Path, err: OSError | None = None) -> str:
    """What to record: the folder whose disk is full, and the fix."""
    why = f" ({err.strerror})" if err is not None and err.strerror else ""
    return (
        f"the filesystem of {run_dir} is full{why}: the ranks could not write their checkpoint, results or logs; "
        "free space there, then relaunch with --resume (it continues from the newest complete checkpoint)"
    )


def low_on_space(run_dir: str | Path) -> bool:
    """The run folder's filesystem has less than LOW_BYTES left for this user (False when that cannot be told)."""
    try:
        info = os.statvfs(run_dir)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < LOW_BYTES


def update(run_dir: str | Path, /, *, attempt: dict | None = None, **changes) -> RunRecord:
    """update_record, and for a full disk: give back the reserve, record the full disk in the message, write again.
    Raises (a FileError naming run.json) only when even that has no room."""
    try:
        return update_record(run_dir, attempt=attempt, **changes)
    except OSError as err:  # a FileError for a full disk is one
        if err.errno not in FULL or not release(run_dir):
            raise
        return update_record(run_dir, attempt=attempt, **{**changes, "message": full_disk_note(run_dir, err)})


def update_or_show(record: RunRecord, run_dir: str | Path, /, *, attempt: dict | None = None, **changes) -> RunRecord:
    """`update`, for an observer (`status`, `runs`): when the disk has no room even for that, the record as it would
    be, with the full disk said in its message, so the command still shows what it found."""
    try:
        return update(run_dir, attempt=attempt, **changes)
    except OSError as err:
        if err.errno not in FULL:
            raise
        shown = dataclasses.replace(record, **{**changes, "message": full_disk_note(run_dir, err)})
        if attempt and shown.attempts:
            last = dataclasses.replace(shown.attempts[-1], **attempt)
            shown = dataclasses.replace(shown, attempts=(*shown.attempts[:-1], last))
        return shown
