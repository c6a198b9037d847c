"""Ordinary filesystem errors are the user's, not internal errors: a name over NAME_MAX, a path over PATH_MAX, a
read-only folder. Each is one message naming the path, exit 2; an OSError no user or filesystem causes (EBADF)
is still an internal error. Real paths, a real read-only filesystem (tests/support/filesystems.py), the real CLI."""

from __future__ import annotations

import errno
import os

import pytest

from specdraft.cli import boundary
from specdraft.errors import FileError, UserError, file_error
from specdraft.fsutil import atomic_write_text
from tests.support.cli import run_cli
from tests.support.filesystems import LONG_NAME, long_path, read_only_dir
from tests.unit.execute.test_launch_hostile import _run_folder


def _refused(result, path, *words) -> None:
    assert result.returncode == 2, result
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    shown = " ".join(result.stderr.split())  # rich wraps long lines on the terminal width
    assert str(path)[:200] in shown, result.stderr
    for word in words:
        assert word in shown, result.stderr


@pytest.fixture
def paths(tmp_path):
    return {
        "name over NAME_MAX": (tmp_path / LONG_NAME, "File name too long"),
        "path over PATH_MAX": (long_path(tmp_path), "File name too long"),
    }


@pytest.mark.parametrize("kind", ["name over NAME_MAX", "path over PATH_MAX"])
def test_plan_launch_status_runs_validate_and_export_name_a_path_too_long(tmp_path, paths, kind):
    path, reason = paths[kind]
    _refused(run_cli("plan", "-o", path / "plan.json" if kind.startswith("path") else path), path, reason)
    _refused(run_cli("plan", "--picture", f"{path}.png"), path, reason)
    _refused(run_cli("launch", "--run-dir", path, "--executor", "local", cwd=tmp_path), path, reason, "shorter path")
    _refused(run_cli("status", path, cwd=tmp_path), path, reason)
    _refused(run_cli("logs", path, cwd=tmp_path), path, reason)
    _refused(run_cli("cancel", path, cwd=tmp_path), path, reason)
    _refused(run_cli("runs", "--root", path), path, reason)
    _refused(run_cli("validate", f"{path}.yaml"), path, reason)
    _refused(run_cli("search", "-o", f"{path}.yaml"), path, reason)
    run = _run_folder(tmp_path / "run", executor="local", job_id="local-4242", state="COMPLETED")
    _refused(run_cli("export", run, "-o", path), path, reason)
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "runs").exists()


def test_a_read_only_folder_is_named_for_plan_launch_search_and_picture(tmp_path):
    with read_only_dir(tmp_path / "ro") as folder:
        result = run_cli("plan", "-o", folder / "plan.json")
        _refused(result, folder / "plan.json", "cannot write plan")
        assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
        _refused(run_cli("plan", "-o", folder / "sub" / "plan.json"), folder / "sub" / "plan.json")
        _refused(run_cli("search", "-o", folder / "best.yaml"), folder / "best.yaml", "cannot write layout")
        _refused(run_cli("launch", "--run-dir", folder / "run", "--executor", "local", cwd=tmp_path), folder / "run")
        assert os.listdir(folder) == []


def test_the_boundary_keeps_genuine_bugs_internal_and_filesystem_errors_the_users(capsys):
    def fail(err):
        def entry():
            raise err

        return boundary.run(entry)

    assert fail(OSError(errno.EBADF, "Bad file descriptor")) == 1
    assert "internal error: OSError" in capsys.readouterr().err
    assert fail(OSError(errno.EINVAL, "Invalid argument", "/x")) == 1
    assert "internal error" in capsys.readouterr().err
    assert fail(OSError(errno.ENOSPC, "No space left on device", "/data/run/run.json")) == 2
    err = capsys.readouterr().err
    assert "/data/run/run.json" in err and "the disk is full" in err and "internal error" not in err
    assert fail(OSError(errno.EROFS, "Read-only file system")) == 2  # no path known: still the filesystem's
    assert "internal error" not in capsys.readouterr().err


def test_a_file_error_is_a_user_error_and_still_the_oserror(tmp_path):
    wrapped = file_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "x", "write plan")
    assert isinstance(wrapped, UserError) and isinstance(wrapped, OSError) and isinstance(wrapped, FileError)
    assert wrapped.errno == errno.ENOSPC and wrapped.filename == tmp_path / "x"
    assert str(wrapped).startswith(f"cannot write plan {tmp_path / 'x'}: No space left on device (the disk is full)")
    assert file_error(OSError(errno.EBADF, "Bad file descriptor")) is None
    with pytest.raises(FileError) as raised:  # what the ranks' `except OSError` around their result write sees
        atomic_write_text(tmp_path / LONG_NAME, "{}", what="result file")
    assert raised.value.errno == errno.ENAMETOOLONG and "cannot write result file" in raised.value.message
