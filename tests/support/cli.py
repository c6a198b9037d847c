"""The `specdraft` CLI in this process: the real typer app through the real error boundary, output captured.

    result = run_cli("plan", "-o", path)      # -> CliResult(code, stdout, stderr)

In-process, so a test can set the umask or the working directory around it and inspect files right after; the
subprocess fixture `specdraft_cli` (tests/conftest.py) is the one for signals and real process trees.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass

_REGISTERED = {"done": False}


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str


def run_cli(*args, cwd=None) -> CliResult:
    from specdraft.cli import boundary, main

    if not _REGISTERED["done"]:
        main._register_optional_commands()
        _REGISTERED["done"] = True
    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    debug = os.environ.pop("SPECDRAFT_DEBUG", None)  # the boundary's messages are what the tests read
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = boundary.run(lambda: main.app(list(map(str, args)), standalone_mode=False))
    finally:
        os.chdir(before)
        if debug is not None:
            os.environ["SPECDRAFT_DEBUG"] = debug
    return CliResult(code, out.getvalue(), err.getvalue())
