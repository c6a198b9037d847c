"""Files inside a run folder, opened safely: regular files only, no symbolic link below the folder, bounded reads.

Every path is walked one component at a time from a descriptor of the run folder with O_NOFOLLOW, so a link planted
anywhere below it (a log linked to /etc/shadow, `submitit` linked to /) is refused, not followed, and a FIFO or
device opened with O_NONBLOCK and checked by fstat never blocks or streams forever (specdraft.fsutil's rule).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from specdraft import jsonfile
from specdraft.errors import UserError
from specdraft.fsutil import NotRegularFile, file_kind
from specdraft.jsonfile import BadJson

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR)


class BadRunFile(BadJson):
    """A run file (run.json, plan.json, a result, a metrics line, a checkpoint marker) that is not what specdraft
    writes there."""


def parse_json(text: str | bytes, source: str, fix: str = "") -> Any:
    """``text`` as JSON through the one bounded parser (specdraft.jsonfile.parse): anything json.loads refuses or
    turns into a number no run file holds (an integer past 40 digits, a float that overflows to inf, NaN/Infinity)
    or nesting too deep is one BadRunFile naming ``source``, never a ValueError or RecursionError."""
    return jsonfile.parse(
        text,
        source,
        fix or "specdraft writes it whole; it was edited or damaged by another program: restore or remove it",
        error=BadRunFile,
    )


def _refuse(root: Path, rel: str, why: str) -> NotRegularFile:
    return NotRegularFile(
        f"{Path(root) / rel} is {why}; specdraft opens only regular files inside a run folder and follows no link",
        "remove it (specdraft never creates one there)",
    )


@contextlib.contextmanager
def _parent(root: str | os.PathLike, rel: str) -> Iterator[tuple[int, str]]:
    """(descriptor of rel's folder, rel's last component), walked without following links."""
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if not parts or any(p == ".." or "/" in p for p in parts) or Path(rel).is_absolute():
        raise ValueError(f"{rel!r} is not a path inside the run folder")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno in _LINK_ERRORS:
                    raise _refuse(Path(root), "/".join(parts[: i + 1]), "a link or not a folder") from None
                raise
            os.close(fd)
            fd = nxt
        yield fd, parts[-1]
    finally:
        os.close(fd)


def open_file(root: str | os.PathLike, rel: str, flags: int, mode: int = 0o666) -> int:
    with _parent(root, rel) as (dir_fd, name):
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _refuse(Path(root), rel, "a symbolic link") from None
            if err.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing
                raise _refuse(Path(root), rel, "a FIFO") from None
            raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _refuse(Path(root), rel, file_kind(info.st_mode))
    os.set_blocking(fd, True)
    return fd


def read_bytes(root: str | os.PathLike, rel: str, limit: int) -> bytes | None:
    """The whole regular file root/rel if it holds at most ``limit`` bytes; None when absent.

    Raises NotRegularFile for a link, FIFO, device or folder, and UserError when the file is larger than ``limit``.
    """
    try:
        fd = open_file(root, rel, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UserError(
            f"{Path(root) / rel} is larger than {limit:,} bytes, far more than specdraft writes there",
            "remove it or move it out of the run folder",
        )
    return data


def read_text(root: str | os.PathLike, rel: str, limit: int) -> str | None:
    """UTF-8 text of a bounded regular file (undecodable bytes replaced); None when absent."""
    data = read_bytes(root, rel, limit)
    return None if data is None else data.decode("utf-8", errors="replace")


def read_range(root: str | os.PathLike, rel: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
    """(up to ``max_bytes`` from ``offset``, the file's size now); None when absent. A negative offset counts from
    the end (the last ``-offset`` bytes)."""
    try:
        fd = open_file(root, rel, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size + offset) if offset < 0 else offset
        return os.pread(fd, max(0, min(max_bytes, size - start)), start), size
    finally:
        os.close(fd)


def open_append(root: str | os.PathLike, rel: str) -> int:
    """A descriptor for appending to root/rel (created if absent); a link or special file is refused."""
    return open_file(root, rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def open_lock(root: str | os.PathLike, rel: str) -> int:
    """A read-write descriptor of a lock file (created if absent); a link or special file is refused."""
    return open_file(root, rel, os.O_RDWR | os.O_CREAT)


def make_dir(root: str | os.PathLike, rel: str) -> Path:
    """root/rel as a real folder (created if absent); a link or file in its place is refused."""
    with _parent(root, rel) as (dir_fd, name):
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)  # less the umask, like every folder the user creates
        except FileExistsError:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                raise _refuse(Path(root), rel, "a link or not a folder") from None
    return Path(root) / rel


def is_dir(root: str | os.PathLike, rel: str) -> bool:
    """True when root/rel is a real folder (not a link to one)."""
    try:
        with _parent(root, rel) as (dir_fd, name):
            return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except (OSError, NotRegularFile):
        return False


def list_names(root: str | os.PathLike, rel: str) -> list[str]:
    """The entries of the real folder root/rel (not a link to one); [] when it is absent or not a real folder."""
    try:
        with _parent(root, rel) as (dir_fd, name):
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except (OSError, NotRegularFile):
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def size(root: str | os.PathLike, rel: str) -> int | None:
    """The size of the regular file root/rel, reached without following a link; None for anything else."""
    try:
        with _parent(root, rel) as (dir_fd, name):
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (OSError, ValueError, NotRegularFile):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
