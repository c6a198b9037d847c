"""scripts/mypy_baseline.py: the per-module mypy baseline fails on any change of count and only ever shrinks.

The script runs as `make lint` runs it, in its own process (its exit code is the contract), reading a saved mypy
output instead of running mypy, so every case stays fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "mypy_baseline.py"


def mypy_output(counts: dict[str, int]) -> str:
    """Text as mypy prints it: errors (with and without a column), a note that is not an error, the summary."""
    lines = []
    for module, n in counts.items():
        for i in range(n):
            col = ":7" if i % 2 else ""
            lines.append(f'{module}:{10 + i}{col}: error: Item "None" of "X | None" has no attribute "y"  [union-attr]')
        lines.append(f'{module}:99: note: Right operand is of type "int | None"')
    lines.append(f"Found {sum(counts.values())} errors in {len(counts)} files (checked 9 source files)")
    return "\n".join(lines) + "\n"


def run(tmp_path: Path, baseline: dict[str, int] | None, current: dict[str, int], *flags: str):
    base = tmp_path / "baseline.json"
    if baseline is not None:
        base.write_text(json.dumps(baseline, indent=2) + "\n")
    out = tmp_path / "mypy.txt"
    out.write_text(mypy_output(current))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--baseline", str(base), "--mypy-output", str(out), *flags],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return proc, base


A, B, C = "specdraft/a.py", "specdraft/pkg/b.py", "specdraft/c.py"


def test_same_counts_pass(tmp_path):
    proc, _ = run(tmp_path, {A: 3, B: 1}, {A: 3, B: 1})
    assert proc.returncode == 0, proc.stderr
    assert "4 errors in 2 modules" in proc.stdout


def test_more_errors_fail_naming_module_and_both_counts(tmp_path):
    proc, _ = run(tmp_path, {A: 3, B: 1}, {A: 4, B: 1})
    assert proc.returncode == 1
    assert f"{A}: 4 mypy errors (baseline 3)" in proc.stderr
    assert B not in proc.stderr


def test_new_module_with_errors_fails(tmp_path):
    proc, _ = run(tmp_path, {A: 3}, {A: 3, C: 2})
    assert proc.returncode == 1
    assert f"{C}: 2 mypy errors (not in the baseline, so 0 allowed)" in proc.stderr


def test_fewer_errors_fail_until_the_baseline_is_updated(tmp_path):
    proc, _ = run(tmp_path, {A: 3, B: 1}, {A: 2})
    assert proc.returncode == 1
    assert f"{A}: 2 mypy errors (baseline 3)" in proc.stderr
    assert f"{B}: 0 mypy errors (baseline 1)" in proc.stderr
    assert "scripts/mypy_baseline.py --update" in proc.stderr


def test_update_lowers_and_drops_counts_sorted_one_per_line(tmp_path):
    proc, base = run(tmp_path, {B: 5, A: 3, C: 1}, {B: 2, A: 3}, "--update")
    assert proc.returncode == 0, proc.stderr
    assert base.read_text() == json.dumps({A: 3, B: 2}, indent=2) + "\n"
    again, _ = run(tmp_path, None, {B: 2, A: 3})  # the rewritten baseline now passes as it is
    assert again.returncode == 0, again.stderr


def test_update_refuses_to_raise_any_count(tmp_path):
    before = {A: 3, B: 5}
    proc, base = run(tmp_path, before, {A: 4, B: 1}, "--update")
    assert proc.returncode == 1
    assert f"{A}: 4 mypy errors (baseline 3)" in proc.stderr
    assert "--update refused" in proc.stderr
    assert json.loads(base.read_text()) == before  # not even B's lower count is written


def test_init_records_only_where_there_is_no_baseline(tmp_path):
    proc, base = run(tmp_path, None, {B: 2, A: 1}, "--init")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(base.read_text()) == {A: 1, B: 2}
    proc, _ = run(tmp_path, None, {B: 9}, "--init")
    assert proc.returncode == 1
    assert json.loads(base.read_text()) == {A: 1, B: 2}


@pytest.mark.parametrize("text", ["not json", '{"specdraft/a.py": 0}', '{"specdraft/a.py": "3"}', "[1]"])
def test_a_damaged_baseline_is_refused(tmp_path, text):
    base = tmp_path / "baseline.json"
    base.write_text(text)
    out = tmp_path / "mypy.txt"
    out.write_text(mypy_output({A: 1}))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--baseline", str(base), "--mypy-output", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "restore it from git" in proc.stderr


def test_the_committed_baseline_is_sorted_and_positive():
    text = (REPO / "mypy-baseline.json").read_text()
    data = json.loads(text)
    assert text == json.dumps(dict(sorted(data.items())), indent=2) + "\n"
    assert all(n > 0 and (REPO / module).is_file() for module, n in data.items())
