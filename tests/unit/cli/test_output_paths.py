"""User-named outputs are written only to regular files (or stdout for `-`); reads of special files never block.

Every hostile target is built for real: FIFOs, symlinks, a socket, a folder, a device node.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from specdraft.errors import UserError
from specdraft.fsutil import atomic_write_text, check_output_path, read_regular_file
from tests.support.cli import run_cli
from tests.support.paths import REPO

ROOT = REPO


def cli(*args, cwd):
    # In this process (tests/support/cli.py); a write or read that opened a FIFO would block, and the timeout
    # marks on the tests below turn that into a failure rather than a hung suite.
    return run_cli(*args, cwd=cwd, env={"COLUMNS": "200"})


def hostile_targets(folder: Path) -> dict[str, Path]:
    """One of each thing that is not a regular file, each a name in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    out["fifo"] = folder / "fifo"
    os.mkfifo(out["fifo"])
    (folder / "mine.txt").write_text("the user's own file\n")
    out["symlink to a file"] = folder / "link"
    out["symlink to a file"].symlink_to(folder / "mine.txt")
    out["dangling symlink"] = folder / "dangling"
    out["dangling symlink"].symlink_to(folder / "nowhere")
    out["folder"] = folder / "dir"
    out["folder"].mkdir()
    out["socket"] = folder / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(out["socket"]))
    server.close()  # the socket file stays
    if os.geteuid() == 0:  # a private character device (same numbers as /dev/null) that may safely be clobbered
        out["device"] = folder / "null"
        os.mknod(out["device"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return out


def snapshot(path: Path) -> tuple:
    st = os.lstat(path)
    return (stat.S_IFMT(st.st_mode), st.st_ino, os.readlink(path) if path.is_symlink() else None)


def test_atomic_write_refuses_everything_but_a_regular_file(tmp_path):
    targets = hostile_targets(tmp_path)
    for kind, target in targets.items():
        before = snapshot(target)
        with pytest.raises(UserError, match="refusing to write") as err:
            atomic_write_text(target, "x")
        assert str(target) in str(err.value) and "not a regular file" in str(err.value), kind
        assert snapshot(target) == before, f"{kind} was changed"
    assert (tmp_path / "mine.txt").read_text() == "the user's own file\n", "the link's target was not written"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_dev_null_is_refused_by_the_check_before_any_write():
    # Only the check runs against the real /dev/null (the write path is exercised on a private device node above).
    with pytest.raises(UserError, match="character device"):
        check_output_path("/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_regular_file_is_replaced_whole_and_long_names_work(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    long_name = tmp_path / ("p" * 250)
    atomic_write_text(long_name, "ok")  # the temp file's name must stay under NAME_MAX
    assert long_name.read_text() == "ok"
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="not a folder|is a file"):
        atomic_write_text(blocker / "x.json", "y")


@pytest.mark.timeout(60)
def test_cli_outputs_refuse_special_files_and_leave_them_alone(tmp_path):
    targets = hostile_targets(tmp_path / "t")
    commands = [
        ("plan", "--format", "json", "-o"),
        ("plan", "-o"),
        ("rollout", "profile", "--csv"),
        ("rollout", "simulate", "--seeds", "1", "--steps", "1", "--plot"),
    ]
    for kind, target in targets.items():
        before = snapshot(target)
        # Every kind through plan -o; the other outputs share its check, so two kinds each suffice there.
        for command in commands if kind in ("fifo", "symlink to a file") else commands[:1]:
            out = cli(*command, str(target), cwd=tmp_path)
            assert out.returncode == 2, (kind, command, out.stderr)
            assert "not a regular file" in out.stderr and str(target) in out.stderr, (kind, command, out.stderr)
            assert "Traceback" not in out.stderr and "internal error" not in out.stderr
            assert snapshot(target) == before, (kind, command)


@pytest.mark.timeout(60)
def test_dash_means_stdout_and_nothing_else_is_printed_with_it(tmp_path):
    out = cli("plan", "-o", "-", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == "tiny-cpu"
    out = cli("rollout", "profile", "--csv", "-", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert rows and set(rows[0]) >= {"tp", "batch", "context", "decode_s"}
    assert list(tmp_path.iterdir()) == [], "no file named '-' was created"
    png = cli("rollout", "simulate", "--seeds", "1", "--plot", "-", cwd=tmp_path)
    assert png.returncode == 2 and "PNG" in png.stderr


def test_reads_refuse_fifos_and_devices_without_blocking(tmp_path):
    targets = hostile_targets(tmp_path)
    for kind in ("fifo", "folder", "socket"):
        with pytest.raises(UserError, match="not a regular file|cannot read"):
            read_regular_file(targets[kind], 1024, "layout file")
    with pytest.raises(UserError, match="character device"):
        read_regular_file("/dev/zero", 1024, "layout file")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2048)
    with pytest.raises(UserError, match="2,048 bytes; the limit is 1,024"):
        read_regular_file(big, 1024, "layout file")
    linked = tmp_path / "linked.yaml"
    linked.symlink_to(big)
    assert read_regular_file(linked, 4096, "layout file") == b"#" * 2048  # a link to a regular file is fine


@pytest.mark.timeout(60)
def test_cli_inputs_that_are_fifos_end_with_exit_2(tmp_path):
    targets = hostile_targets(tmp_path / "t")
    for args in (
        ("validate", str(targets["fifo"])),
        ("plan", "/dev/zero"),
        ("rollout", "simulate", "--workload", str(targets["fifo"])),
        ("rollout", "simulate", "--profile", str(targets["fifo"])),
    ):
        out = cli(*args, cwd=tmp_path)
        assert out.returncode == 2 and "not a regular file" in out.stderr, (args, out.stderr)
