"""The CLI's one error boundary: an exception-to-message table, exit code 2 for the user's errors.

No traceback unless SPECDRAFT_DEBUG=1. An OSError a user or a filesystem can cause (errors.FILESYSTEM_ERRNOS: a
path too long, a read-only or full disk, a missing permission) is the user's too, naming the path; unknown
exceptions, any other OSError included, are internal errors (exit 1) and say so.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from specdraft.errors import SpecError, UserError, file_error

PIPED_WIDTH = 160  # columns of a table printed to a file or a pipe: the widest (search's) fits


def debug() -> bool:
    return os.environ.get("SPECDRAFT_DEBUG", "") not in ("", "0")


def _spec_error(err: SpecError) -> str:
    return str(err) + "\n(every problem is listed; fix them and run `specdraft validate` again)"


def _user_error(err: UserError) -> str:
    return str(err)


def _os_error(err: OSError) -> str:
    return str(file_error(err))


def _filesystem(err: BaseException) -> bool:
    return file_error(err) is not None


# (Which exceptions, message, exit code). Order matters: the first that matches wins.
TABLE: list[tuple[Callable[[BaseException], bool], Callable[[BaseException], str], int]] = [
    (lambda err: isinstance(err, SpecError), _spec_error, 2),
    (lambda err: isinstance(err, UserError), _user_error, 2),
    (_filesystem, _os_error, 2),
]


def run(entry: Callable[[], int | None]) -> int:
    """Call ``entry``; map known errors to a message on stderr and an exit code."""
    import typer
    from typer.exceptions import TyperException  # typer >= 0.29 vendors click; usage errors derive from this

    try:
        result = entry()
        return int(result or 0)
    except typer.Exit as err:
        return err.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except TyperException as err:
        if debug():
            raise
        show = getattr(err, "show", None)
        if show is not None:
            show()
        else:
            _print_error(err.format_message())
        return getattr(err, "exit_code", 2) or 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BaseException as err:
        if isinstance(err, SystemExit):
            raise
        if debug():
            raise
        for matches, render, code in TABLE:
            if matches(err):
                _print_error(render(err))
                return code
        _print_error(
            f"internal error: {type(err).__name__}: {err}\n"
            "this is a bug in specdraft; rerun with SPECDRAFT_DEBUG=1 for the traceback and report it"
        )
        return 1


def console(stderr: bool = False):
    """The one rich console setup every command prints through (rich is imported only when output is due)."""
    from rich.console import Console

    out = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        # Piped into a file or a job log, rich assumes 80 columns and elides the tables' cells ("weigh…").
        out.width = PIPED_WIDTH
    return out


def _print_error(message: str) -> None:
    """One message on stderr; it may quote run files (a rank's stderr tail, a result's error), so it is printed
    without their escape sequences and control characters, and its '[' opens no markup."""
    from specdraft.cli.terminal import plain, safe

    err = console(stderr=True)
    first, _, rest = message.partition("\n")
    err.print(f"[bold red]error:[/] {safe(first)}")
    if rest:
        err.print(plain(rest), markup=False)
