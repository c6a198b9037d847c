"""Whole-process speed of the CLI against megatron-core's own rank-group construction, measured in one run.

Run: `.venv/bin/python benchmarks/plan_speed.py [--repeats N]`. Prints the median wall time of each command
(a fresh process each time) and its ratio against the baseline: importing megatron-core and building the same
16,384-GPU layout's groups with RankGenerator.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIG = ["layouts/llama3-70b.yaml", "cluster.num_nodes=2048", "parallel.tp=8", "parallel.cp=8", "parallel.pp=16"]
SPECDRAFT = [sys.executable, "-m", "specdraft.cli"]
BASELINE = [
    sys.executable,
    "-c",
    (
        "from megatron.core.parallel_state import RankGenerator\n"
        "g = RankGenerator(tp=8, ep=1, dp=16, pp=16, cp=8, order='tp-cp-ep-dp-pp')\n"
        "for t in ('tp', 'cp', 'dp', 'pp', 'tp-cp', 'dp-cp', 'tp-pp'):\n"
        "    g.get_ranks(t)\n"
    ),
]

CASES = [
    ("specdraft --help", SPECDRAFT + ["--help"]),
    ("specdraft plan (default layout)", SPECDRAFT + ["plan"]),
    ("specdraft plan --format json (16,384 GPUs)", SPECDRAFT + ["plan", *BIG, "--format", "json"]),
]


def wall(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    baseline = wall(BASELINE, args.repeats)
    print(f"{'command':<46} {'median s':>9} {'vs megatron-core baseline':>26}")
    print(f"{'baseline: import megatron-core + RankGenerator':<46} {baseline:>9.3f} {'1.00x':>26}")
    for label, cmd in CASES:
        t = wall(cmd, args.repeats)
        print(f"{label:<46} {t:>9.3f} {f'{baseline / t:.1f}x faster':>26}")


if __name__ == "__main__":
    main()
