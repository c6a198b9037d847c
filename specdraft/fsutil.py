"""Files the user names: atomic writes to regular files only, and bounded reads that never block.

A write goes to a temp file in the target's directory, is fsynced, then os.replace'd over the target, and only
ever replaces a regular file: a FIFO, symlink, device node, socket or directory at the target is refused by name,
since os.replace would silently turn it into a regular file (as root, `-o /dev/null` would replace the device).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from specdraft.errors import UserError

STDOUT = "-"  # the output name that means standard output, where a command offers it


class NotRegularFile(UserError):
    """A path that exists but is not a regular file (a FIFO, device, socket, directory or a refused link)."""


def file_kind(mode: int) -> str:
    """What a stat mode is, in words ('a regular file', 'a FIFO (named pipe)', ...)."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "a special file"


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """Refuse (UserError) a target that exists and is not a regular file, or whose folder is not a folder.

    Symlinks are not followed: a link is refused even when it points at a regular file, so a write never lands
    somewhere other than the path the user named.
    """
    target = Path(path)
    if str(path) == "":
        raise UserError(f"the {what} path is empty", "name a file")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        raise UserError(f"cannot write {what} {target}: a folder on its path is a file", "pick another path") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise UserError(
            f"cannot write {what} {target}: {getattr(err, 'strerror', None) or err}", "pick another path"
        ) from None
    if mode is not None and not stat.S_ISREG(mode):
        raise UserError(
            f"refusing to write {what} {target}: it is {file_kind(mode)}, not a regular file",
            "name a regular file (or `-` for standard output where the option offers it); specdraft "
            "never replaces a link, pipe, device or folder",
        )
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(f"cannot write {what} {target}: {parent} is not a folder", "pick another path")
    return target


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one.

    Raises UserError when something other than a regular file is at ``path`` (see ``check_output_path``).
    """
    target = check_output_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temp name stays under NAME_MAX (255) whatever the target's name is.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        check_output_path(target)  # again, right before the replace: narrows the window for a swap to a FIFO
        os.replace(tmp, target)
    except BaseException:
        # Leave no temp file behind; the original exception still propagates.
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode)


def write_output(path: str, data: str | bytes, what: str = "output") -> None:
    """A command's user-named output: ``-`` is standard output, anything else an atomic write to a regular file.

    Every failure (a special file at the target, a missing permission, a full disk) is a UserError naming it.
    """
    if path == STDOUT:
        if isinstance(data, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
        return
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        atomic_write_bytes(path, payload)
    except OSError as err:
        raise UserError(
            f"cannot write {what} {path}: {err.strerror or err}", "check the folder and its permissions"
        ) from None


def read_regular_file(path: str | os.PathLike, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``max_bytes`` (symlinks to one are fine).

    Opened non-blocking, so a FIFO at ``path`` is refused instead of waiting forever for a writer; a device such
    as /dev/zero is refused instead of read without end.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}", f"pass the path of an existing {what}") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise UserError(
            f"cannot read {what} {path}: {getattr(err, 'strerror', None) or err}", "check the path and its permissions"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(
                f"{what} {path} is {file_kind(st.st_mode)}, not a regular file", "pass the path of a regular file"
            )
        if st.st_size > max_bytes:
            raise UserError(
                f"{what} {path} is {st.st_size:,} bytes; the limit is {max_bytes:,}",
                f"a {what} this large is not one specdraft reads",
            )
        chunks, total = [], 0
        while total <= max_bytes:  # bounded even if the file grows while it is read
            chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise UserError(f"{what} {path} grew past {max_bytes:,} bytes while it was read", "try again")
        return b"".join(chunks)
    except OSError as err:
        raise UserError(f"cannot read {what} {path}: {err.strerror or err}", "check the path") from None
    finally:
        os.close(fd)


def read_regular_text(path: str | os.PathLike, max_bytes: int, what: str = "file") -> str:
    """UTF-8 text of :func:`read_regular_file`; a file that is not UTF-8 is a UserError, not a traceback."""
    data = read_regular_file(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {err.start})", "check the path") from None
