"""The CLI in this process: typer's CliRunner isolation around specdraft.cli.main's app and its one error boundary.

What `specdraft ARGS` does, minus the interpreter start: the same app, the same boundary (cli/boundary.py: its
messages, exit codes 2 and 1), stdout and stderr captured apart and not a terminal (as when piped). A test about
the process itself (signals, a real pipe, hash seeds across runs, what a fresh interpreter imports, a traceback
under SPECDRAFT_DEBUG=1) runs the real `specdraft` instead.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import typer.testing
from typer.testing import CliRunner


@dataclass(frozen=True)
class CliResult:
    """The fields of subprocess.CompletedProcess the tests read, so a test can switch without other changes."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def _app():
    from specdraft.cli import main as cli_main

    # main() registers the lazily imported command groups before it runs the app; do it once per process.
    if not any(group.name == "rollout" for group in cli_main.app.registered_groups):
        cli_main._register_optional_commands()
    return cli_main.app


def run_cli(
    *args: object, cwd: str | Path | None = None, env: dict[str, str | None] | None = None, input: str | None = None
) -> CliResult:
    """`specdraft ARGS` in this process, in ``cwd``, with ``env`` over os.environ (None unsets a variable).

    SPECDRAFT_DEBUG is unset unless ``env`` sets it: the boundary's messages are what the tests read.
    """
    from specdraft.cli.boundary import run

    app = _app()
    argv = [str(a) for a in args]
    # A wide terminal unless the test says otherwise, whatever runs the tests (an xdist worker has none)
    overrides: dict[str, str | None] = {"SPECDRAFT_DEBUG": None, "COLUMNS": "200", **(env or {})}
    runner = CliRunner()
    with contextlib.chdir(cwd or Path.cwd()), runner.isolation(input=input, env=overrides) as (out, err, _):
        # The isolation pins help text to 80 columns; a real process sizes it from COLUMNS or the terminal.
        # isolation() restores the pinned value on the way out.
        typer.testing.formatting.FORCED_WIDTH = None
        try:
            code = run(lambda: app(args=argv, prog_name="specdraft", standalone_mode=False))
        except SystemExit as exit_:  # as the interpreter maps sys.exit's argument to a status
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    return CliResult(
        tuple(argv), code, stdout.decode(runner.charset, "replace"), stderr.decode(runner.charset, "replace")
    )
