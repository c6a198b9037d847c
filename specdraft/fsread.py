"""Bounded reads of regular files: a FIFO, device node or huge file named as a plan, record or log never hangs us.

Opened with O_NONBLOCK (a FIFO would otherwise block the open itself) and checked with fstat on the open descriptor,
so the file that is read is the file that was checked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from specdraft.errors import UserError


class NotRegularFile(UserError):
    """The path exists but is not a regular file (a FIFO, device, socket or directory)."""


def _open_regular(path: Path, what: str, *, follow_symlinks: bool = True) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as err:
        if not follow_symlinks and path.is_symlink():
            raise NotRegularFile(f"{what} {path} is a symbolic link; specdraft does not follow links here",
                                 "replace the link by the file itself") from None
        raise UserError(f"cannot open {what} {path}: {err.strerror}", "check the path and its permissions") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a directory" if stat.S_ISDIR(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a regular file")
        raise NotRegularFile(f"{what} {path} is {kind}, not a regular file", "point it at a regular file")
    return fd


def read_regular_bytes(path: str | os.PathLike, limit: int, *, what: str = "file",
                       follow_symlinks: bool = True) -> bytes:
    """The whole file, if it is a regular file of at most ``limit`` bytes; FileNotFoundError when absent."""
    path = Path(path)
    fd = _open_regular(path, what, follow_symlinks=follow_symlinks)
    try:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UserError(f"{what} {path} is larger than {limit:,} bytes", "this is not a file specdraft wrote; "
                        "check the path")
    return data


def read_regular_text(path: str | os.PathLike, limit: int, *, what: str = "file",
                      follow_symlinks: bool = True) -> str:
    """UTF-8 text of a bounded regular file; UserError when missing, not regular, too large or not UTF-8."""
    try:
        data = read_regular_bytes(path, limit, what=what, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}", "check the path") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {err.start})", "check the path") from None


def tail_regular(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> bytes | None:
    """The last ``max_bytes`` of a regular file; None when it is absent or not a regular file."""
    try:
        fd = _open_regular(Path(path), "file", follow_symlinks=follow_symlinks)
    except (FileNotFoundError, UserError):
        return None
    try:
        os.set_blocking(fd, True)
        size = os.fstat(fd).st_size
        return os.pread(fd, max_bytes, max(0, size - max_bytes))
    finally:
        os.close(fd)
