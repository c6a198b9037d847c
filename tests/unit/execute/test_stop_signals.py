"""Stops that lose nothing, with real processes and real signals (stand-in ranks and payloads: plain Python processes
that act on SIGTERM the way the real ones do, so each case runs in seconds; tests/dist/test_launch_local.py stops
real ranks).

- The local launcher, told to stop (Ctrl-C, SIGTERM, SIGHUP), waits for its ranks' save up to training.stop_grace_s,
  then SIGKILLs them; told again meanwhile, it kills at once. It records how every rank ended either way.
- A CLI that runs a payload (export, rollout measure) takes it down with itself: a stop signal is forwarded to the
  payload's process group, which gets a bounded time to clean up, then the group (grandchildren too) is killed;
  a SIGKILLed CLI leaves no payload behind either (the kernel's parent-death signal).
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

from tests.support.paths import REPO
from tests.support.signals import default_sigint

# A stand-in rank: on SIGTERM it finishes "its step and save" (SAVE_S seconds), writes saved-RANK and exits 75, as the
# runtime does; without one it runs forever.
RANK = r"""
import os, signal, sys, time
save_s, out = float(sys.argv[1]), sys.argv[2]
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
open(os.path.join(out, f"started-{os.environ['RANK']}"), "w").close()
while not stop:
    time.sleep(0.05)
time.sleep(save_s)
open(os.path.join(out, f"saved-{os.environ['RANK']}"), "w").close()
sys.exit(75)
"""

# The launcher as `launch --executor local` runs it: local.run on a real plan, its stop lines and outcome printed.
LAUNCHER = r"""
import json, sys
from specdraft.assemble import compile
from specdraft.execute import local
from specdraft.spec.load import load_layout
grace, save_s, out = sys.argv[1], sys.argv[2], sys.argv[3]
plan = compile(load_layout(None, ["cluster.gpus_per_node=2", "parallel.cp=1", f"training.stop_grace_s={grace}"]))
argv = [sys.executable, "-c", sys.argv[4], save_s, out]
outcome = local.run(plan, out, argv, 3600, lambda pgid, pids: print("started", flush=True), lambda c, e: None,
                    lambda line: print(line, flush=True))
print(json.dumps({"codes": outcome.exit_codes, "interrupted": outcome.interrupted}), flush=True)
"""


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SPECDRAFT_DEBUG", None)
    return env


def _launch(tmp_path: Path, grace: float, save_s: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(grace), str(save_s), str(tmp_path), RANK],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=default_sigint,
    )
    assert proc.stdout.readline().strip() == "started", proc.stderr.read()
    _wait_for(lambda: all((tmp_path / f"started-{r}").exists() for r in range(2)))
    return proc


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _outcome(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    assert proc.returncode == 0, out + err
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def test_a_stopped_launcher_waits_for_the_ranks_save(tmp_path):
    """A step plus its save longer than the old 5 s grace: the ranks save and exit 75, none is killed."""
    proc = _launch(tmp_path, grace=300, save_s=6)
    proc.send_signal(signal.SIGINT)
    outcome, said = _outcome(proc)
    assert outcome == {"codes": {"0": 75, "1": 75}, "interrupted": True}
    assert (tmp_path / "saved-0").exists() and (tmp_path / "saved-1").exists()
    assert "stopping: every rank finishes its step and saves a checkpoint; waiting up to 300 s" in said


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_the_wait_is_bounded_by_stop_grace_s(tmp_path, sig):
    proc = _launch(tmp_path, grace=1, save_s=600)
    proc.send_signal(sig)
    outcome, said = _outcome(proc)
    assert outcome == {"codes": {"0": -9, "1": -9}, "interrupted": True}
    assert not list(tmp_path.glob("saved-*")) and "waiting up to 1 s (training.stop_grace_s)" in said


def test_a_second_interrupt_kills_at_once(tmp_path):
    proc = _launch(tmp_path, grace=300, save_s=600)
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().startswith("stopping:")
    proc.send_signal(signal.SIGINT)
    outcome, said = _outcome(proc)
    assert outcome == {"codes": {"0": -9, "1": -9}, "interrupted": True}
    assert "interrupted again: killing the ranks" in said and not list(tmp_path.glob("saved-*"))


# ---------------------------------------------------------------------------------------------- payloads

# A stand-in payload with a child of its own; on SIGTERM it removes its half-written output and exits, unless told
# to ignore SIGTERM (a payload stuck in C code).
PAYLOAD = r"""
import json, os, signal, subprocess, sys, time
out, ignore = sys.argv[1], sys.argv[2] == "ignore"
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
half = os.path.join(out, "half-written")
open(half, "w").close()
def stop(*a):
    os.remove(half)
    sys.exit(130)
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else stop)
with open(os.path.join(out, "pids.json"), "w") as f:
    json.dump({"payload": os.getpid(), "child": child.pid}, f)
time.sleep(600)
"""

# The CLI side: payload.run_command under the real error boundary, the exit code what `specdraft` would return.
CLI = r"""
import sys
from specdraft.cli import boundary
from specdraft.execute import payload
payload.STOP_GRACE_S = float(sys.argv[3])
cmd = [sys.executable, "-c", sys.argv[4], sys.argv[1], sys.argv[2]]
sys.exit(boundary.run(lambda: payload.run_command(cmd, print)))
"""


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not reaped by a PID 1 that never reaps, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _cli(tmp_path: Path, mode: str = "clean", grace: float = 30.0) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, str(tmp_path), mode, str(grace), PAYLOAD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=default_sigint,
    )
    _wait_for(lambda: (tmp_path / "pids.json").exists() and (tmp_path / "pids.json").stat().st_size > 0)
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert _alive(pids["payload"]) and _alive(pids["child"])
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_cli_stopped_by_a_signal_takes_its_payload_down(tmp_path, sig):
    proc, pids = _cli(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert not _alive(pids["payload"]) and not _alive(pids["child"]), "the payload outlived its CLI"
    assert not (tmp_path / "half-written").exists(), "the payload was not given the chance to clean up"


def test_a_payload_that_ignores_the_stop_is_killed_after_the_grace(tmp_path):
    proc, pids = _cli(tmp_path, mode="ignore", grace=1.0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert not _alive(pids["payload"]) and not _alive(pids["child"])


def test_a_killed_cli_leaves_no_payload(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    proc, pids = _cli(tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=60)
        _wait_for(lambda: not _alive(pids["payload"]))  # the kernel's SIGTERM; it cleans up and exits
        assert not (tmp_path / "half-written").exists()
    finally:
        for pid in pids.values():  # the stand-in's own child is no payload of the CLI: the test's to remove
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
