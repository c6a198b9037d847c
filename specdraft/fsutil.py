"""Files the user names: atomic writes to regular files only, and bounded reads that never block.

A write goes to a temp file in the target's directory, is fsynced, then os.replace'd over the target, and only
ever replaces a regular file: a FIFO, symlink, device node, socket or directory at the target is refused by name,
since os.replace would silently turn it into a regular file (as root, `-o /dev/null` would replace the device).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import sys
from pathlib import Path

from specdraft.errors import UserError, file_error

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


def lstat_or_none(path: str | os.PathLike, action: str = "use") -> os.stat_result | None:
    """``os.lstat(path)``, or None when nothing is there; a name too long, a permission missing and the like are a
    FileError naming ``path`` (a UserError), any other OSError propagates."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        user = file_error(err, path, action)
        if user is None:
            raise
        raise user from None


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """Refuse (UserError) a target that exists and is not a regular file, or whose folder is not a folder.

    Symlinks are not followed: a link is refused even when it points at a regular file, so a write never lands
    somewhere other than the path the user named.
    """
    target = Path(path)
    if str(path) == "":
        raise UserError(f"the {what} path is empty", "name a file")
    try:
        found = lstat_or_none(target, f"write {what}")  # a FileError names a name too long, a file on the path
    except ValueError:
        raise UserError(f"cannot write {what} {target}: the path holds a NUL byte", "pick another path") from None
    mode = None if found is None else found.st_mode
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


def current_umask() -> int:
    """This process's umask, read without changing it (Linux's /proc), else by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` as a file created now gets it: what the umask allows (0o666 -> 0o644 under umask 022)."""
    return mode & ~current_umask() & 0o7777


def _temp_name(parent: Path, prefix: str, suffix: str) -> Path:
    return parent / f"{prefix}{secrets.token_hex(8)}{suffix}"


def make_temp_dir(parent: str | os.PathLike, prefix: str, suffix: str) -> Path:
    """A new, uniquely named folder in ``parent`` whose mode is 0o777 less the umask (mkdtemp's is 0o700 whatever
    the umask, so a folder that is renamed into place would keep out the group the umask lets in)."""
    for _ in range(100):
        path = _temp_name(Path(parent), prefix, suffix)
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(parent))


def _create_temp_file(parent: Path, prefix: str, suffix: str, mode: int) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = _temp_name(parent, prefix, suffix)
        try:
            return os.open(path, flags, mode), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(parent))


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o666, what: str = "output") -> Path:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one.

    The file's mode is ``mode`` less the umask, as for any file created (0o644 under umask 022, 0o600 under 077):
    a plan holding slurm.env secrets stays private where the user's umask says so. Raises UserError when
    something other than a regular file is at ``path`` (see ``check_output_path``), and a FileError (a UserError
    that is still the OSError) naming ``path`` for what a user or a filesystem causes: a read-only folder, a full
    disk, a missing permission, a name too long.
    """
    target = check_output_path(path, what)
    try:
        return _atomic_write(target, data, mode, what)
    except OSError as err:
        user = file_error(err, target, f"write {what}")
        if user is None:
            raise
        raise user from None


def _atomic_write(target: Path, data: bytes, mode: int, what: str) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temp name stays under NAME_MAX (255) whatever the target's name is.
    fd, tmp = _create_temp_file(target.parent, f".{target.name[:100]}.", ".tmp", mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        check_output_path(target, what)  # again, right before the replace: narrows the window for a swap to a FIFO
        os.replace(tmp, target)
    except BaseException:
        # Leave no temp file behind; the original exception still propagates.
        tmp.unlink(missing_ok=True)
        raise
    return target


def atomic_write_text(path: str | os.PathLike, text: str, mode: int = 0o666, what: str = "output") -> Path:
    """Text flavour of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode, what)


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
    atomic_write_bytes(path, data.encode("utf-8") if isinstance(data, str) else data, what=what)


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
