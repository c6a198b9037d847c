"""Run the real rank payload (`python -m specdraft.runtime.entry`) as N local processes with torchrun-style env, and
signal or SIGKILL them from the test: what a launcher does, without a launcher in the way.

    run = RankRun.start(run_dir, world_size, "--workload", "cotrain", "--steps", "8")
    run.wait_for(lambda: (run_dir / "x").exists())
    run.kill(signal.SIGKILL)
    codes = run.wait()
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TIMING_FIELDS = ("step_time_s", "draft_time_s")  # the only metrics that may differ between two runs of one plan


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_plan(run_dir: Path, overrides: list[str], layout: Path | None = None):
    """Compile ``layout`` (default: the built-in one) with ``overrides`` into run_dir/plan.json; returns the plan."""
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    plan = compile(load_layout(layout, overrides))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(plan.to_json())
    return plan


@dataclass
class RankRun:
    run_dir: Path
    procs: list[subprocess.Popen]

    @classmethod
    def start(cls, run_dir: Path, world_size: int, *args: str, env: dict | None = None) -> "RankRun":
        port = free_port()
        procs = []
        for rank in range(world_size):
            rank_env = {
                **os.environ,
                **(env or {}),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "SPECDRAFT_DIST_TIMEOUT_S": "120",
            }
            for key in [k for k in rank_env if k.startswith("SLURM_")]:
                del rank_env[key]
            with open(run_dir / f"rank-{rank}.out", "ab") as out, open(run_dir / f"rank-{rank}.err", "ab") as err:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "specdraft.runtime.entry", str(run_dir / "plan.json"), *args],
                        env=rank_env,
                        cwd=run_dir,
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                    )
                )
        return cls(run_dir, procs)

    def wait_for(self, condition, timeout: float = 240, what: str = "the condition") -> None:
        """Poll ``condition`` until it holds; fail (killing the ranks) if they all exit or time runs out first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if all(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                self.kill(signal.SIGKILL)
                raise AssertionError(f"{what} never held; ranks exited with {self.wait()}:\n{self.stderr_tail()}")
            time.sleep(0.02)

    def kill(self, sig: int, ranks: list[int] | None = None) -> None:
        for rank, proc in enumerate(self.procs):
            if (ranks is None or rank in ranks) and proc.poll() is None:
                proc.send_signal(sig)

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                raise AssertionError(f"ranks still running after {timeout} s:\n{self.stderr_tail()}") from None
        return [p.returncode for p in self.procs]

    def stderr_tail(self, lines: int = 15) -> str:
        out = []
        for rank in range(len(self.procs)):
            text = (self.run_dir / f"rank-{rank}.err").read_text(errors="replace").splitlines()
            text = [t for t in text if "warn" not in t.lower()]
            out.append(f"--- rank {rank} stderr:\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


def result(run_dir: Path, rank: int) -> dict:
    return json.loads((run_dir / "results" / f"rank-{rank:05d}.json").read_text())
