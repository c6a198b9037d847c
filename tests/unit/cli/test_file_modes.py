"""Written files follow the umask: 0o666 less the umask for files, 0o777 less it for folders, whatever writes them.

Under umask 077 a `plan -o` holding slurm.env secrets is private; under 022 a run folder and an export are readable by
the group and others, as any file the user creates. Each test sets the umask itself and restores it after.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from specdraft.fsutil import atomic_write_text, current_umask, make_temp_dir, umask_mode
from specdraft.runs import files as runfiles
from tests.support.cli import run_cli

UMASKS = [0o077, 0o022, 0o027, 0o002]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request):
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_umask_is_read_without_changing_it(umask):
    assert current_umask() == umask and current_umask() == umask
    assert umask_mode(0o666) == 0o666 & ~umask and umask_mode(0o777) == 0o777 & ~umask


def test_atomic_writes_and_run_folder_files_follow_the_umask(umask, tmp_path):
    assert mode(atomic_write_text(tmp_path / "a.json", "{}")) == 0o666 & ~umask
    assert mode(atomic_write_text(tmp_path / "run.sh", "#!/bin/sh\n", mode=0o777)) == 0o777 & ~umask
    # Rewriting a file that was private gives the umask's mode, not the old file's.
    (tmp_path / "b.json").write_text("{}")
    os.chmod(tmp_path / "b.json", 0o600)
    assert mode(atomic_write_text(tmp_path / "b.json", "[]")) == 0o666 & ~umask
    assert mode(make_temp_dir(tmp_path, ".x.", ".tmp")) == 0o777 & ~umask
    assert mode(runfiles.make_dir(tmp_path, "logs")) == 0o777 & ~umask
    os.close(runfiles.open_append(tmp_path, "logs/rank-0.out"))
    assert mode(tmp_path / "logs" / "rank-0.out") == 0o666 & ~umask
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") and p.is_file()]


def test_a_plan_with_secrets_is_as_private_as_the_umask_says(umask, tmp_path):
    out = tmp_path / "plan.json"
    result = run_cli("plan", "slurm.env.HF_TOKEN=hf_secret", "-o", out, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert "hf_secret" in out.read_text()
    assert mode(out) == 0o666 & ~umask
    if umask & 0o077 == 0o077:
        assert mode(out) & 0o077 == 0, "group and others can read the plan's secrets"
