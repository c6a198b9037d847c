"""A full disk is one clear message, run.json records it, and `status` keeps working: on a real, small tmpfs filled
for real (tests/support/filesystems.py; skipped where mounting is not permitted). tests/dist/test_launch_local.py
fills one during a real checkpoint."""

from __future__ import annotations

import errno
import json
import os

import pytest

from specdraft.errors import FileError
from specdraft.execute import diskspace
from specdraft.runs.record import read_record
from tests.support.cli import run_cli
from tests.support.filesystems import small_filesystem
from tests.support.rank_procs import write_plan
from tests.unit.execute.test_launch_hostile import _run_folder


def _fill(folder) -> None:
    """Write until the filesystem says ENOSPC, in ever smaller pieces, so not a byte is left."""
    fd = os.open(folder / "ballast", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for piece in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, os.urandom(piece))
            except OSError as err:
                assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _lost_run(disk):
    """A local run recorded RUNNING whose launcher is gone: `status` finds it LOST and records that."""
    folder = _run_folder(disk / "run", executor="local", job_id="local-4242", state="RUNNING")
    write_plan(folder, ["cluster.gpus_per_node=2", "parallel.cp=1"])
    return folder


def test_status_on_a_full_disk_with_the_reserve_records_what_it_found(tmp_path):
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        folder = _lost_run(disk)
        diskspace.make_reserve(folder)
        _fill(disk)
        result = run_cli("status", folder, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "state LOST" in result.stdout and "internal error" not in result.stderr
        record = read_record(folder)
        assert record.state == "LOST" and f"the filesystem of {folder} is full" in record.message
        assert not (folder / diskspace.RESERVE).exists()


def test_status_on_a_full_disk_without_room_shows_the_state_without_recording_it(tmp_path):
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        folder = _lost_run(disk)
        _fill(disk)
        result = run_cli("status", folder, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "state LOST" in result.stdout and "is full" in result.stdout
        assert json.loads((folder / "run.json").read_text())["state"] == "RUNNING"  # no room: unchanged
        listing = run_cli("runs", "--root", disk, cwd=tmp_path)
        assert listing.returncode == 0 and "LOST" in listing.stdout, listing.stderr


def test_a_launch_onto_a_full_disk_is_refused_by_name(tmp_path):
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        _fill(disk)
        with pytest.raises(FileError) as err:
            diskspace.make_reserve(disk)
        assert err.value.errno == errno.ENOSPC and str(disk / diskspace.RESERVE) in err.value.message
        assert not (disk / diskspace.RESERVE).exists()
        result = run_cli("launch", "--executor", "local", "--run-dir", disk / "run", cwd=tmp_path)
        assert result.returncode == 2 and "No space left on device" in result.stderr, result.stderr
        assert "internal error" not in result.stderr and str(disk / "run") in " ".join(result.stderr.split())
