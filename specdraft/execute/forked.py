"""The ranks of a local CPU run forked by runtime/starter.py instead of started one interpreter each: the handles
that stand in for Popen (poll, wait, returncode, pid) and the thread that reads the starter's reports.

Used when the payload is the runtime entry on a CPU plan with more ranks than cores: with fewer, the ranks import
side by side on their own cores in the time the starter takes alone. SPECDRAFT_LOCAL_FORK=1 forks whenever it can,
0 never (GPU plans never fork: each rank initialises CUDA itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

ENTRY = "specdraft.runtime.entry"
STARTER = "specdraft.runtime.starter"
SWITCH_ENV = "SPECDRAFT_LOCAL_FORK"
START_TIMEOUT_S = 600.0  # the starter's imports on a crowded machine; it reports each rank as it forks it


def entry_args(argv: list[str], gpu: str, num_ranks: int) -> list[str] | None:
    """The entry's arguments when ``argv`` is `PYTHON -u -m specdraft.runtime.entry ...` with this interpreter (not
    one that --python names, whose environment may differ) on a CPU plan, and forking pays (more ranks than cores)
    or SPECDRAFT_LOCAL_FORK=1 asks for it; None: start each rank as its own interpreter."""
    switch = os.environ.get(SWITCH_ENV, "")
    pays = num_ranks > (os.cpu_count() or 1)
    if gpu != "cpu" or switch == "0" or not (pays or switch == "1") or not argv or argv[0] != sys.executable:
        return None
    if len(argv) < 4 or argv[1:4] != ["-u", "-m", ENTRY]:
        return None
    return argv[4:]


class ForkedRank:
    """One rank forked by the starter, with the part of Popen's interface the local executor uses."""

    def __init__(self, rank: int, reports: Reports):
        self.rank, self._reports = rank, reports
        self.pid = 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reports.changed:
            while self.returncode is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"rank {self.rank}", timeout or 0.0)
                self._reports.changed.wait(left if left is not None else 1.0)
        return self.returncode


class Reports:
    """Reads the starter's stdout: each rank's pid as it is forked and its exit code as it is reaped. A starter
    that ends without reporting a rank (killed, or it failed before forking) ends that rank with its own code."""

    def __init__(self, starter: subprocess.Popen, num_ranks: int):
        self.starter = starter
        self.changed = threading.Condition()
        self.ranks = [ForkedRank(r, self) for r in range(num_ranks)]
        self._ended = threading.Event()  # the starter's reports are over (it exited or was killed)
        self._thread = threading.Thread(target=self._read, name="starter-reports", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.starter.stdout is not None  # PIPE in start()
        for line in self.starter.stdout:
            report = json.loads(line)
            with self.changed:
                rank = self.ranks[report["rank"]]
                if "pid" in report:
                    rank.pid = report["pid"]
                else:
                    rank.returncode = report["code"]
                self.changed.notify_all()
        self._ended.set()
        code = self.starter.wait()
        with self.changed:
            for rank in self.ranks:
                if rank.returncode is None:
                    rank.returncode = _orphan_code(rank.pid, code)
            self.changed.notify_all()

    def abandon(self) -> int:
        """Stopped before every rank was forked: the starter is killed so that it forks no more; the process group
        of the ranks it forked (0: none)."""
        self.starter.kill()
        self._ended.wait()
        with self.changed:
            return self.ranks[0].pid

    def pids(self) -> list[int]:
        """Every rank's pid once all are forked (or the starter ended first: those never forked are 0)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.changed:
            while not all(r.pid or r.returncode is not None for r in self.ranks):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the rank starter forked no rank within {START_TIMEOUT_S:g} s")
                self.changed.wait(1.0)
            return [r.pid for r in self.ranks]


def _orphan_code(pid: int, starter_code: int) -> int:
    """A rank the starter did not report: it never forked (the starter's own failure), or the starter was killed
    under it. Such a rank is waited for by its pid (it is no child of ours) and counts as failed."""
    while pid:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(0.2)
    return starter_code or 1


def start(argv: list[str], args: list[str], envs: list[dict], logs: list[tuple[int, int]], cwd: str):
    """Start the starter for ranks with environments ``envs`` and log descriptors ``logs`` (stdout, stderr); its
    own stderr goes to rank 0's. Returns the Reports, whose ranks stand in for Popen."""
    workload = args[args.index("--workload") + 1] if "--workload" in args[:-1] else "selftest"
    fds = [fd for pair in logs for fd in pair]
    starter = subprocess.Popen(
        [argv[0], "-u", "-m", STARTER, *args],
        env=envs[0],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=logs[0][1],
        pass_fds=fds,
        cwd=cwd,
        text=True,
    )
    reports = Reports(starter, len(envs))
    ranks = [{"env": env, "stdout_fd": out, "stderr_fd": err} for env, (out, err) in zip(envs, logs)]
    request = {"workload": workload, "ranks": ranks}
    assert starter.stdin is not None  # PIPE above
    try:
        starter.stdin.write(json.dumps(request) + "\n")
        starter.stdin.close()
    except BrokenPipeError:
        pass  # it failed at once; its stderr (rank 0's log) says why and Reports ends every rank with its code
    return reports
