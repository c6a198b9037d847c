"""Hostile run folders, crafted records and a Slurm that lies or hangs: status, logs, cancel and launch end cleanly.

Every hostile input is built for real (FIFOs, symlinks, device nodes, crafted JSON). A misbehaving Slurm controller
cannot be caused on demand, so those tests put stub `sacct`/`squeue`/`scancel` first on PATH; each stub logs its
argv, so the tests see exactly what would have reached Slurm.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from specdraft.errors import UserError
from specdraft.execute import monitor
from specdraft.execute.slurm import commands as slurmcmd
from specdraft.runs.record import Attempt, LocalProcesses, new_record
from specdraft.runs.rundir import MARKER, claim_run_dir, read_record, replace_record

STUB = """#!{python}
import json, os, sys, time
name = os.path.basename(sys.argv[0])
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
behaviour = json.loads(os.environ.get("STUB_" + name.upper(), "{{}}"))
time.sleep(behaviour.get("sleep", 0))
sys.stdout.write(behaviour.get("out", ""))
sys.stderr.write(behaviour.get("err", ""))
sys.exit(behaviour.get("rc", 0))
"""


@pytest.fixture
def slurm_stubs(tmp_path, monkeypatch):
    """Stub Slurm tools first on PATH; returns calls() -> the argv of every call so far."""
    folder = tmp_path / "stub-bin"
    folder.mkdir()
    for name in ("sacct", "squeue", "scancel", "sinfo", "scontrol", "sbatch"):
        (folder / name).write_text(STUB.format(python=sys.executable))
        (folder / name).chmod(0o755)
    log = tmp_path / "stub-calls.jsonl"
    log.touch()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(log))

    def calls() -> list[list[str]]:
        return [[Path(argv[0]).name, *argv[1:]] for argv in map(json.loads, log.read_text().splitlines())]

    return calls


def _behave(monkeypatch, tool: str, **behaviour) -> None:
    monkeypatch.setenv(f"STUB_{tool.upper()}", json.dumps(behaviour))


def _run_folder(
    folder: Path,
    executor: str = "slurm",
    job_id: str | None = "12345",
    state: str = "RUNNING",
    world_size: int = 2,
    **fields,
) -> Path:
    """A run folder with a valid record (no plan.json: the commands under test must stop before needing one,
    or the test adds one)."""
    claim_run_dir(folder)
    replace_record(
        folder,
        new_record(
            name="tiny-cpu",
            run_dir=str(folder),
            executor=executor,
            job_id=job_id,
            job_name="tiny-cpu-0123abcd",
            state=state,
            intent_epoch=time.time(),
            plan_hash="0" * 64,
            spec_sha256="0" * 64,
            specdraft_version="0.1.0",
            world_size=world_size,
            workload="selftest",
            attempts=(Attempt(attempt=1, executor=executor, job_id=job_id, state=state, intent="2026-01-01"),),
            **fields,
        ),
    )
    return folder


def _edit_record(folder: Path, **changes) -> None:
    path = folder / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# ------------------------------------------------------------------ a user's folder is not a run folder (item 2)


def test_launch_into_a_users_folder_is_refused_and_nothing_there_changes(specdraft_in_process, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "plan.json").write_text('{"my": "own plan"}\n')
    (folder / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}
    for argv in (
        ["launch", "--executor", "local", "--run-dir", folder, "--force"],
        ["launch", "--executor", "slurm", "--run-dir", folder],
        ["status", folder],
        ["logs", folder],
        ["cancel", folder],
    ):
        proc = specdraft_in_process(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert "not a specdraft run folder" in proc.stderr or "no run folder" in proc.stderr, proc.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()} == before
    # The same, with a run.json of the user's: still not specdraft's (no marker), still untouched.
    (folder / "run.json").write_text(json.dumps({"state": "mine"}))
    for argv in (["status", folder], ["cancel", folder], ["launch", "--executor", "local", "--run-dir", folder]):
        proc = specdraft_in_process(*argv)
        assert proc.returncode == 2 and "not a specdraft run folder" in proc.stderr, proc.stderr
    assert (folder / "run.json").read_text() == json.dumps({"state": "mine"})
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "plan.json", "run.json"]


def test_an_empty_folder_is_adopted_and_a_marker_that_is_a_link_is_not_trusted(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_run_dir(empty) == empty and (empty / MARKER).is_file()
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "data.csv").write_text("1,2\n")
    (forged / MARKER).symlink_to(empty / MARKER)
    with pytest.raises(UserError, match="not a specdraft run folder"):
        claim_run_dir(forged)


# ------------------------------------------------------------------ job ids never become options (item 4)


def test_an_option_as_job_id_never_reaches_slurm(specdraft_in_process, tmp_path, slurm_stubs):
    folder = _run_folder(tmp_path / "run")
    for crafted, commands in (
        ("--user=root", ("cancel", "status", "logs")),
        ("-u0", ("cancel",)),
        ("12345 --user=root", ("cancel",)),
        ("12345,--user=root", ("status",)),
    ):
        _edit_record(folder, job_id=crafted)
        for command in commands:
            proc = specdraft_in_process(command, folder)
            assert proc.returncode == 2 and "job_id" in proc.stderr, (crafted, command, proc.stderr)
    assert slurm_stubs() == []
    with pytest.raises(UserError, match="not a Slurm job id"):
        slurmcmd.job_states(["--user=root"])
    with pytest.raises(UserError, match="not a Slurm job id"):
        slurmcmd.cancel("-u0")
    assert slurm_stubs() == []


def test_valid_job_ids_reach_slurm_bound_to_their_option_or_after_double_dash(
    specdraft_in_process, tmp_path, slurm_stubs, monkeypatch
):
    for job_id in ("12345", "12345_7", "12345+1"):
        folder = _run_folder(tmp_path / f"run-{job_id}", job_id=job_id)
        _behave(monkeypatch, "sacct", out=f"{job_id}|RUNNING|n1\n")
        proc = specdraft_in_process("cancel", folder, env={"PATH": os.environ["PATH"]})
        assert proc.returncode == 0 and f"cancelled Slurm job {job_id}" in proc.stdout, proc.stderr
        assert read_record(folder).state == "CANCELLED"
    calls = slurm_stubs()
    assert [c for c in calls if c[0] == "scancel"] == [["scancel", "--", j] for j in ("12345", "12345_7", "12345+1")]
    for call in calls:
        ids = [a for a in call[1:] if a.startswith("--jobs=")]
        assert call[0] == "scancel" or ids, call
        # Every value an option takes is bound to it with '=' (never a separate word that could start with '-').
        assert all(not a.startswith("-") or a.startswith("--") or a in ("-X", "-n", "-P", "-h", "-o") for a in call[1:])


# ------------------------------------------------------------------ nothing hangs, nothing blows up (item 5)


def test_an_unresponsive_controller_bounds_status_and_cancel(tmp_path, slurm_stubs, monkeypatch):
    folder = _run_folder(tmp_path / "run")
    for tool in ("sacct", "squeue", "scancel"):
        _behave(monkeypatch, tool, sleep=600)
    # Long enough for the stub (a Python script) to start and log its argv on a loaded machine, far below 600 s.
    monkeypatch.setattr(slurmcmd, "QUERY_TIMEOUT_S", 2.0)
    monkeypatch.setattr(slurmcmd, "CANCEL_TIMEOUT_S", 2.0)
    state, record, seen = monitor.current_state(folder, read_record(folder))
    assert state == "RUNNING" and "did not answer" in seen.source and not seen.gone
    with pytest.raises(UserError, match="scancel 12345 did not answer within 2 s"):
        monitor.cancel(folder, record)
    assert [c[0] for c in slurm_stubs()] == ["sacct", "squeue", "sacct", "squeue", "scancel"]


@pytest.mark.timeout(60)  # a follow that never stopped would fail here, not hang
def test_follow_returns_when_slurm_no_longer_knows_the_job(specdraft_in_process, tmp_path, slurm_stubs, monkeypatch):
    folder = _run_folder(tmp_path / "run")
    (folder / "submitit").mkdir()
    (folder / "submitit" / "12345_0_log.out").write_text("rank 0 was here\n")
    _behave(monkeypatch, "sacct", out="")
    _behave(monkeypatch, "squeue", rc=1, err="slurm_load_jobs error: Invalid job id specified\n")
    proc = specdraft_in_process("logs", folder, "--rank", "0", "--follow", env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 was here" in proc.stdout and "no longer know job 12345" in proc.stderr
    # --wait (monitor.wait) stops too instead of polling until the time limit.
    with pytest.raises(UserError, match="Slurm no longer knows job 12345"):
        monitor.wait(folder, 3600, lambda progress: None, poll_s=0.01)


def _hostile(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "shadow":
        path.symlink_to("/etc/shadow")
    elif kind == "dir":
        path.mkdir()


@pytest.fixture(scope="module")
def plan():
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(None))


@pytest.mark.timeout(60)  # a read that waited on the FIFO or device would fail here, not hang
def test_fifos_links_and_devices_in_a_run_folder_end_in_exit_2_not_a_hang(specdraft_in_process, tmp_path, plan):
    folder = _run_folder(
        tmp_path / "run",
        executor="local",
        job_id="local-4242",
        state="COMPLETED",
        world_size=plan.world_size,
        local=LocalProcesses(pgid=4242, pids=(4242,), launcher_pid=4242),
    )
    (folder / "results").mkdir()
    originals = {"run.json": (folder / "run.json").read_bytes(), "plan.json": plan.to_json().encode()}
    (folder / "plan.json").write_bytes(originals["plan.json"])
    cases = [
        ("run.json", "fifo", "status"),
        ("run.json", "zero", "status"),
        ("run.json", "dir", "cancel"),
        ("plan.json", "fifo", "status"),
        ("plan.json", "zero", "status"),
        ("results/rank-00001.json", "fifo", "status"),
        ("metrics.jsonl", "fifo", "status"),
        ("metrics.jsonl", "zero", "status"),
        ("logs/rank-0.out", "fifo", "logs"),
        ("logs/rank-0.err", "shadow", "logs"),
        ("logs/rank-1.out", "zero", "logs"),
    ]
    expected = {"fifo": "is a FIFO", "zero": "symbolic link", "shadow": "symbolic link", "dir": "a directory"}
    for rel, kind, command in cases:
        _hostile(folder / rel, kind)
        proc = specdraft_in_process(command, folder)
        assert proc.returncode == 2, (rel, kind, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
        assert expected[kind] in proc.stderr and rel in proc.stderr, (rel, kind, proc.stderr)
        assert "root:" not in proc.stdout
        (folder / rel).unlink() if kind != "dir" else (folder / rel).rmdir()
        if rel in originals:
            (folder / rel).write_bytes(originals[rel])


def test_a_link_out_of_the_run_folder_is_never_followed_on_the_way_in(specdraft_in_process, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "12345_0_log.out").write_text("SECRET\n")
    folder = _run_folder(tmp_path / "run", state="COMPLETED")
    (folder / "submitit").symlink_to(outside)
    proc = specdraft_in_process("logs", folder, "--rank", "0", env={"PATH": "/nonexistent"})
    assert proc.returncode == 2 and "SECRET" not in proc.stdout and "a link or not a folder" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
@pytest.mark.timeout(60)  # a read that waited on the FIFO or device would fail here, not hang
def test_a_device_node_as_a_log_is_refused(specdraft_in_process, tmp_path):
    folder = _run_folder(tmp_path / "run", executor="local", job_id="local-4242", state="COMPLETED")
    (folder / "logs").mkdir()
    os.mknod(folder / "logs" / "rank-0.out", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    proc = specdraft_in_process("logs", folder, "--rank", "0")
    assert proc.returncode == 2 and "character device" in proc.stderr, proc.stderr


def test_locks_that_are_links_are_refused_and_their_targets_untouched(specdraft_in_process, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = _run_folder(tmp_path / "run", executor="local", job_id="local-4242", state="FAILED")
    (folder / ".launch.lock").symlink_to(victim)
    proc = specdraft_in_process("launch", "--executor", "local", "--run-dir", folder, "--force")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
    assert victim.read_text() == "precious\n"


# ------------------------------------------------------------------ one broken record breaks nothing else (item 10)


def test_a_corrupt_record_is_a_broken_row_and_status_picks_the_newest_readable_run(specdraft_in_process, tmp_path):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    plan = compile(load_layout(None))
    runs = tmp_path / "runs"
    good = _run_folder(
        runs / "good", executor="local", job_id="local-4242", state="COMPLETED", world_size=plan.world_size
    )
    (good / "plan.json").write_text(plan.to_json())
    for name, text in (("list", "[1, 2]"), ("huge", json.dumps({"world_size": 1e9})), ("cut", '{"record_ver')):
        (_run_folder(runs / name, executor="local", job_id="local-4242", state="COMPLETED") / "run.json").write_text(
            text
        )
    _hostile(_run_folder(runs / "fifo", executor="local", job_id="local-4242") / "run.json", "fifo")
    listing = specdraft_in_process("runs")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.count("unreadable") == 4 and "good" in listing.stdout and "COMPLETED" in listing.stdout
    status = specdraft_in_process("status")
    assert status.returncode == 0, status.stderr
    assert "run good" in status.stdout and "state COMPLETED" in status.stdout
    assert "4 other folder(s) under runs/ could not be read" in status.stderr
