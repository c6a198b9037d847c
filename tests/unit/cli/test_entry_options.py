"""The entry point's own options and the shipped layouts by name: `--version`, `-h` on every level, and
`specdraft validate NAME` from any folder."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from specdraft import __version__
from specdraft.cli.main import app
from specdraft.spec.load import shipped_layouts


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_version_option_and_command_print_the_version():
    for argv in (["--version"], ["version"]):
        out = invoke(*argv)
        assert out.exit_code == 0 and out.output.strip() == __version__, out.output


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdraft.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize("argv", [["-h"], ["plan", "-h"], ["rollout", "-h"], ["rollout", "simulate", "-h"]])
def test_short_help_is_help(argv):
    out = cli(*argv)
    assert out.returncode == 0 and out.stdout.startswith("Usage: "), out.stdout + out.stderr
    assert out.stdout == cli(*argv[:-1], "--help").stdout


def test_shipped_layouts_are_found_by_name_from_any_folder(tmp_path):
    names = shipped_layouts()
    assert {"tiny-cpu", "qwen3-8b", "llama3-70b"} <= set(names)
    for spelling in ("qwen3-8b", "qwen3-8b.yaml", "layouts/qwen3-8b.yaml"):
        out = cli("validate", spelling, cwd=tmp_path)
        assert out.returncode == 0 and "valid: qwen3-8b" in out.stdout, (spelling, out.stdout, out.stderr)


def test_a_file_of_the_users_wins_over_a_shipped_name(tmp_path):
    (tmp_path / "qwen3-8b").write_text("name: mine\nmodel: {num_layers: 2}\n")
    out = cli("validate", "qwen3-8b", cwd=tmp_path)
    assert out.returncode == 2 and "valid: qwen3-8b" not in out.stdout, out.stdout
