"""`specdraft search` speed: Llama-3.1-70B on 1,024 H100s against naive enumeration, measured in this process.

    .venv/bin/python benchmarks/search_speed.py [--naive-sample N]

Naive enumeration puts every candidate (base x layer split x draft stage) through the full compile
(specdraft.assemble.compile: validation, memory, rank grid, tap routes, renders) and estimates the ones that
compile. Running all of them would take hours, so it runs a fixed, evenly spaced sample and extrapolates to the
whole candidate count (said in the output). Also printed: the whole `specdraft search` process, median of 3.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdraft.assemble import compile  # noqa: E402
from specdraft.errors import SpecError  # noqa: E402
from specdraft.perf.estimate import estimate  # noqa: E402
from specdraft.search.ranking import search  # noqa: E402
from specdraft.search.space import bases, candidate_spec, splits  # noqa: E402
from specdraft.spec.load import load_layout  # noqa: E402

LAYOUT = ROOT / "layouts" / "llama3-70b.yaml"
OVERRIDES = ["cluster.num_nodes=128"]  # 128 x 8 = 1,024 GPUs


def all_candidates(spec):
    """Every (base, split, draft stage) a search enumerates, in its order."""
    out = []
    for base in bases(spec, frozenset()):
        d = base.dims
        for split in splits(spec, d.pp, frozenset()):
            if split.vpp and (d.num_microbatches < d.pp or d.num_microbatches % d.pp):
                continue
            out += [(base, split, stage) for stage in range(d.pp)]
    return out


def naive_seconds_per_candidate(spec, candidates, sample: int) -> float:
    step = max(len(candidates) // sample, 1)
    picked = candidates[::step][:sample]
    started = time.perf_counter()
    for base, split, stage in picked:
        layout = candidate_spec(spec, base, split, stage)
        try:
            compile(layout)
        except SpecError:
            continue
        estimate(layout)
    return (time.perf_counter() - started) / len(picked)


def cli_seconds() -> float:
    env = {**os.environ, "COLUMNS": "200"}
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "specdraft.cli", "search", str(LAYOUT), *OVERRIDES, "--format", "json"],
            check=True,
            capture_output=True,
            env=env,
            cwd=ROOT,
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--naive-sample", type=int, default=300, help="candidates the naive baseline compiles")
    args = parser.parse_args()
    spec = load_layout(LAYOUT, OVERRIDES)
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        result = search(spec, top_k=10)
        runs.append(time.perf_counter() - started)
    fast = statistics.median(runs)
    candidates = all_candidates(spec)
    per = naive_seconds_per_candidate(spec, candidates, args.naive_sample)
    naive = per * len(candidates)
    best = result.rows[0]
    print(
        f"model Llama-3.1-70B, {spec.cluster.num_nodes} x {spec.cluster.gpus_per_node} {spec.cluster.gpu}, "
        f"seq {spec.model.seq_length}, global batch {spec.training.global_batch_size}, draft on"
    )
    print(
        f"candidates: {len(candidates):,} (search counted {result.num_candidates:,}); "
        f"{result.num_pruned:,} over the memory bound, {result.num_estimated:,} estimated, "
        f"{result.num_verified} verified"
    )
    print(f"search (top 10), median of 5 in-process runs: {fast:.3f} s")
    print(
        f"naive: every candidate through the full compile: {per * 1e3:.2f} ms each over a sample of "
        f"{args.naive_sample}, extrapolated to {len(candidates):,} candidates = {naive:,.0f} s "
        f"({naive / 3600:.1f} h; not run in full)"
    )
    print(f"ratio: search is {naive / fast:,.0f}x faster than naive enumeration")
    print(f"whole process `specdraft search ... --format json`, median of 3: {cli_seconds():.3f} s")
    print(
        f"best: tp{best.layout.dims.tp} cp{best.layout.dims.cp} pp{best.layout.dims.pp} vpp{best.layout.vpp} "
        f"dp{best.layout.dims.dp}, {best.estimate.step_time_s:.3f} s/step"
    )


if __name__ == "__main__":
    main()
