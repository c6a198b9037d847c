"""The in-process CLI runner (tests/support/cli.py) answers as the real `specdraft` does: the same exit code,
stdout and stderr, byte for byte, for successes, the user's errors and click's usage errors. The tests that use
it rely on this."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import SPECDRAFT_BIN
from tests.support.cli import run_cli
from tests.support.paths import REPO

CASES = [
    ("plan",),
    ("plan", "--format", "json"),
    ("validate", "examples/broken.yaml"),  # a SpecError: exit 2, every problem on stderr
    ("status", "no-such-run"),  # a UserError
    ("plan", "--no-such-option"),  # click's usage error, through typer's own message
    ("rollout", "plan"),  # a lazily registered command group
    ("--help",),
]


@pytest.mark.parametrize("argv", CASES, ids=" ".join)
def test_in_process_matches_the_console_script(argv):
    env = {"COLUMNS": "200"}
    real = subprocess.run(
        [str(SPECDRAFT_BIN), *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k != "SPECDRAFT_DEBUG"}, **env},
        timeout=120,
        check=False,
    )
    here = run_cli(*argv, cwd=REPO, env=env)
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)
    assert real.stdout or real.stderr  # each case says something, so the comparison compares text


def test_debug_is_off_unless_asked_and_the_environment_is_restored(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_DEBUG", "1")
    out = run_cli("validate", REPO / "examples" / "broken.yaml")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert os.environ["SPECDRAFT_DEBUG"] == "1"
