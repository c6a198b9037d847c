"""User-facing errors: a Problem names the field path, the bad value, the rule and a fix.

The CLI's single error boundary (specdraft.cli.boundary) turns these into one clear message and exit code 2.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Iterable

# Bounds on what an error echoes back: a 50 MB value must not become 100 MB of error text.
ECHO_CHARS = 200  # a value or field path is cut to this many characters, with an ellipsis
RULE_CHARS = 1000  # a rule or fix (which may quote third-party messages) is cut to this many
MAX_LISTED_PROBLEMS = 100  # a SpecError lists at most this many problems, then says how many more there are


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis and the length it had."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def echo(value: Any, limit: int = ECHO_CHARS) -> str:
    """repr(value), bounded: a huge list or string is not rendered whole just to be cut."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return shorten(repr(value[: limit + 1]), limit)
    if isinstance(value, (list, tuple, dict)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value):,} items>"
    try:
        return shorten(repr(value), limit)
    except RecursionError:  # a value nested hundreds deep (YAML allows ~1,000 levels)
        return f"<deeply nested {type(value).__name__}>"


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong (or worth a warning) in a layout."""

    path: str
    value: Any
    rule: str
    fix: str
    severity: str = "error"

    def render(self) -> str:
        value = "<missing>" if self.value is _MISSING_VALUE else echo(self.value)
        fix = f"; {shorten(self.fix, RULE_CHARS)}" if self.fix else ""
        return f"{shorten(self.path)} = {value}: {shorten(self.rule, RULE_CHARS)}{fix}"

    def to_dict(self) -> dict:
        value = None if self.value is _MISSING_VALUE else self.value
        return {"path": self.path, "value": value, "rule": self.rule, "fix": self.fix}


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING_VALUE = _Missing()
MISSING = _MISSING_VALUE


class SpecdraftError(Exception):
    """Base for every error that is the user's to fix; the CLI prints it without a traceback."""

    exit_code = 2


class SpecError(SpecdraftError):
    """A layout with one or more problems; every problem is reported at once."""

    def __init__(self, problems: Iterable[Problem], source: str | None = None):
        self.problems = tuple(problems)
        self.source = source
        n = len(self.problems)
        where = f" in {source}" if source else ""
        lines = [f"{n} problem{'s' if n != 1 else ''}{where}:"]
        lines += [f"  - {p.render()}" for p in self.problems[:MAX_LISTED_PROBLEMS]]
        if n > MAX_LISTED_PROBLEMS:
            lines.append(f"  ... and {n - MAX_LISTED_PROBLEMS} more (fix these first)")
        super().__init__("\n".join(lines))


class UserError(SpecdraftError):
    """A problem outside the layout itself (a missing file, a run folder in the way, a failed job). ``headline`` is
    one line of it (the message's first), for the views that show one line per rank."""

    def __init__(self, message: str, fix: str = ""):
        self.message = message
        self.fix = fix
        self.headline = message.strip().splitlines()[0] if message.strip() else ""
        super().__init__(f"{message}\n  fix: {fix}" if fix else message)


def headline_of(err: BaseException) -> str | None:
    """The one line that says what went wrong in an error the user fixes (its message's first line, never its fix),
    for the views that show one line per rank; None for any other error, whose last line is the exception."""
    if isinstance(err, UserError):
        return getattr(err, "headline", "") or None
    if isinstance(err, SpecdraftError):
        lines = str(err).strip().splitlines()
        return lines[0] if len(lines) > 1 else None
    return None


# The OSErrors a user or a filesystem causes (a path too long, a read-only or full disk, a missing permission), with
# what each means and the fix; any other errno (EBADF, EINVAL, ...) is a bug in specdraft and stays an internal error.
_PERMISSION = "check the permissions of the path and of the folders above it, or pick another path"
FILESYSTEM_ERRNOS: dict[int, tuple[str, str]] = {
    errno.ENOENT: ("", "check the path"),
    errno.ENOTDIR: ("a folder on the path is a file", "check the path"),
    errno.EISDIR: ("", "name a file, not a folder"),
    errno.EACCES: ("", _PERMISSION),
    errno.EPERM: ("", _PERMISSION),
    errno.ENAMETOOLONG: (
        "a name on the path is longer than NAME_MAX (255 bytes), or the whole path longer than PATH_MAX (4,096)",
        "use a shorter path",
    ),
    errno.EROFS: ("the filesystem is mounted read-only", "pick a folder on a writable filesystem"),
    errno.ENOSPC: ("the disk is full", "free space on that disk, or pick a folder on another one"),
    errno.EDQUOT: ("the disk quota is used up", "free space within your quota, or pick a folder on another disk"),
    errno.EFBIG: ("the file is larger than the filesystem allows", "pick a folder on another filesystem"),
    errno.ELOOP: ("a symbolic link on the path loops, or there are too many", "check the links on the path"),
    errno.EEXIST: ("", "remove it, or pick another path"),
    errno.ENOTEMPTY: ("", "empty the folder, or pick another path"),
    errno.EXDEV: ("the two paths are on different filesystems", "keep them on one filesystem"),
    errno.EMLINK: ("the folder has too many entries or links", "pick another folder"),
    errno.EIO: ("the disk or network filesystem failed to read or write", "check the filesystem, then try again"),
    errno.EBUSY: ("it is in use", "try again once it is free, or pick another path"),
    errno.ETXTBSY: ("it is a program that is running", "pick another path"),
    errno.ESTALE: ("a network filesystem handle went stale", "try again"),
    errno.ENXIO: ("it is a device or FIFO nobody serves", "name a regular file"),
    errno.ENODEV: ("the filesystem does not allow this", "pick a folder on another filesystem"),
    errno.EMFILE: ("this process has too many files open", "raise `ulimit -n`, then try again"),
    errno.ENFILE: ("the system has too many files open", "try again later"),
}


class FileError(UserError, OSError):
    """An OSError a user or a filesystem caused, told as a UserError that names the path. It stays the OSError it
    was (errno, strerror, filename), so code that handles OSError (a rank writing its result) still handles it."""

    def __init__(self, err: OSError, path: str | os.PathLike | None = None, action: str = "use"):
        target = path if path is not None else err.filename
        meaning, fix = FILESYSTEM_ERRNOS.get(err.errno or 0, ("", "check the path"))
        reason = err.strerror or str(err)
        if meaning:
            reason += f" ({meaning})"
        other = f" -> {_shown(err.filename2)}" if err.filename2 is not None else ""
        where = f" {_shown(target)}{other}" if target is not None else ""
        super().__init__(f"cannot {action}{where}: {reason}", fix)
        self.errno, self.strerror, self.filename, self.filename2 = err.errno, err.strerror, target, err.filename2

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


PATH_CHARS = 600  # a path in a message: PATH_MAX is 4,096 bytes, and one past it is what the user sees here


def _shown(path) -> str:
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    return shorten(text, PATH_CHARS)


def file_error(err: BaseException, path: str | os.PathLike | None = None, action: str = "use") -> FileError | None:
    """``err`` as a FileError when a user or a filesystem can cause it (its errno is one of FILESYSTEM_ERRNOS),
    else None: the caller re-raises it, an internal error."""
    if isinstance(err, FileError):
        return err
    if isinstance(err, OSError) and err.errno in FILESYSTEM_ERRNOS:
        return FileError(err, path, action)
    return None


# A `python -m specdraft.runtime.*` payload the CLI runs in a subprocess (export, rollout measure) reports a user
# error as one line on stderr with this prefix and a JSON {"message", "fix"}, then exits 2; the CLI turns the line
# back into a UserError, so both sides print it the same way.
PAYLOAD_ERROR_PREFIX = "SPECDRAFT-ERROR "


def payload_error_line(message: str, fix: str = "") -> str:
    import json

    return PAYLOAD_ERROR_PREFIX + json.dumps({"message": message, "fix": fix})


def parse_payload_error(line: str) -> UserError | None:
    """The UserError a payload's error line carries, or None for any other line."""
    import json

    if not line.startswith(PAYLOAD_ERROR_PREFIX):
        return None
    try:
        data = json.loads(line[len(PAYLOAD_ERROR_PREFIX) :])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    return UserError(str(data.get("message", "")), str(data.get("fix", "")))
