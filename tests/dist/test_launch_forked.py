"""`launch --executor local` on CPU forks its ranks from one starter that did the imports once (execute/forked.py,
runtime/starter.py), and that changes nothing but the start:

- the ranks' parent is the starter, outside their process group;
- a forked run's metrics equal, bit for bit, a run whose ranks each start their own interpreter
  (SPECDRAFT_LOCAL_FORK=0);
- Ctrl-C while the starter still imports leaves no rank behind and the run CANCELLED.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.grpo_metrics import without_timing
from tests.support.paths import SHIPPED
from tests.support.signals import default_sigint

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
LAYOUT = SHIPPED / "grpo-tiny-cpu.yaml"
SPECDRAFT = str(Path(sys.executable).with_name("specdraft"))


def _launch(folder: Path, steps: int, env: dict) -> subprocess.Popen:
    argv = [SPECDRAFT, "launch", str(LAYOUT), "--workload", "grpo", "--steps", str(steps), "--executor", "local"]
    return subprocess.Popen(
        [*argv, "--run-dir", str(folder)],
        cwd=folder.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        preexec_fn=default_sigint,
    )


def _record(folder: Path) -> dict:
    try:
        return json.loads((folder / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _parent_command(pid: int) -> str:
    ppid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return (Path("/proc") / str(ppid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _plan_processes(folder: Path) -> list[int]:
    marker = str(folder / "plan.json").encode()
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def test_forked_ranks_run_as_ranks_started_one_interpreter_each(tmp_path):
    forked, separate = tmp_path / "forked", tmp_path / "separate"
    launcher = _launch(forked, 3, {"SPECDRAFT_LOCAL_FORK": "1"})  # 4 ranks: on more than 4 cores it would not
    try:
        deadline = time.monotonic() + 200
        while not (_record(forked).get("local") or {}).get("pids"):
            assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
            time.sleep(0.05)
        local = _record(forked)["local"]
        parents = {_parent_command(pid) for pid in local["pids"]}
        out, err = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, out + err
    assert len(parents) == 1 and "-m specdraft.runtime.starter" in parents.pop(), "one starter forked every rank"
    assert _record(forked)["state"] == "COMPLETED"
    other = _launch(separate, 3, {"SPECDRAFT_LOCAL_FORK": "0"})
    out, err = other.communicate(timeout=240)
    assert other.returncode == 0, out + err
    assert without_timing(_rows(forked)) == without_timing(_rows(separate))


def test_ctrl_c_while_the_starter_imports_leaves_no_rank(tmp_path):
    folder = tmp_path / "run"
    launcher = _launch(folder, 30, {"SPECDRAFT_LOCAL_FORK": "1"})
    try:
        deadline = time.monotonic() + 60
        while not _plan_processes(folder):  # the starter (its command line names the plan), importing
            assert time.monotonic() < deadline and launcher.poll() is None, "the starter never started"
            time.sleep(0.01)
        assert not _record(folder).get("local"), "no rank forked yet: the imports take seconds"
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert _record(folder)["state"] == "CANCELLED", out + err
    deadline = time.monotonic() + 10
    while _plan_processes(folder):  # a rank SIGKILLed by the stop may take a moment to be reaped
        assert time.monotonic() < deadline, f"left running: {_plan_processes(folder)}"
        time.sleep(0.1)
