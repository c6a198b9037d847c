"""Where adaptive TP pays: the planner against the best static TP across length regimes, and heterogeneous starts.

Run: `.venv/bin/python benchmarks/rollout_tp_regimes.py [--seeds 5]` (a few minutes on 2 cores). Part 1 runs one
generation step of 64 prompts x 8 samples (8B model on one node of 8 H100s) for several (median, cap) regimes,
shorter to longer than the default, and prints adaptive TP (from the auto start) against the best static TP and the
verl baseline (VeRL's TP 2, memory fraction and max_num_seqs, the batch split evenly). Part 2
keeps the default workload and starts from a heterogeneous layout (the predicted-longest samples on a wide group,
the rest on TP1/TP2 groups), with and without the planner's merges. Model-based estimates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.rollout.model import costmodel
from specdraft.rollout.model.workload import LengthModel, synthetic
from specdraft.rollout.schedule import verl
from specdraft.rollout.schedule.adaptive_tp import PlannerConfig, RemainingPredictor
from specdraft.rollout.sim.generation import GenConfig, choose_start, simulate_generation
from specdraft.spec.load import builtin_layout_text, load_layout_text

TPS = [1, 2, 4, 8]
REGIMES = ((300, 4096), (500, 4096), (1000, 8192), (1000, 16384), (3000, 16384))
STARTS = ((4, 1, 1, 1, 1), (2, 2, 1, 1, 1, 1), (2, 1, 1, 1, 1, 1, 1), (4, 2, 1, 1))
WIDE_FIRST = (32, 64, 96, 128)
ERROR = 0.2


def planner(median: float, cap: int) -> PlannerConfig:
    return PlannerConfig(predictor=RemainingPredictor(sigma=ERROR, median=median, cap=cap))


def step(median: float, cap: int, seed: int):
    return synthetic(LengthModel(median=median, cap=cap), 1, 64, 8, 1024, seed, ERROR)[0]


def regimes(cost, verl_cost, seeds: int) -> None:
    print("| median, cap | best static | verl | adaptive | x best static | per seed | x verl | per seed |")
    print("|---|---|---|---|---|---|---|---|")
    for median, cap in REGIMES:
        best, base, ours, x_best, x_verl = [], [], [], [], []
        for seed in range(seeds):
            prompts = step(median, cap, seed)
            static = min(
                simulate_generation(GenConfig(cost=cost, gpus_per_node=8), prompts, tp).makespan_s for tp in TPS
            )
            even = GenConfig(cost=verl_cost, gpus_per_node=8, dispatch="even")
            baseline = simulate_generation(even, prompts, verl.VERL_TP).makespan_s
            cfg = GenConfig(cost=cost, gpus_per_node=8, planner=planner(median, cap))
            start, merges = choose_start(cfg, prompts, TPS)
            adaptive = simulate_generation(
                cfg if merges else GenConfig(cost=cost, gpus_per_node=8), prompts, start
            ).makespan_s
            best.append(static)
            base.append(baseline)
            ours.append(adaptive)
            x_best.append(adaptive / static)
            x_verl.append(adaptive / baseline)
        mean = statistics.fmean
        print(
            f"| {median}, {cap} | {mean(best):.1f} s | {mean(base):.1f} s | {mean(ours):.1f} s | "
            f"{mean(ours) / mean(best):.3f}x | {min(x_best):.3f}x .. {max(x_best):.3f}x | "
            f"{mean(ours) / mean(base):.3f}x | {min(x_verl):.3f}x .. {max(x_verl):.3f}x |"
        )


def heterogeneous(cost, seeds: int) -> None:
    median, cap = 3000, 16384
    static_best = []
    rows: dict = {}
    for seed in range(seeds):
        prompts = step(median, cap, seed)
        static_best.append(
            min(simulate_generation(GenConfig(cost=cost, gpus_per_node=8), prompts, tp).makespan_s for tp in TPS)
        )
        for groups in STARTS:
            for k in WIDE_FIRST:
                for plan in (None, planner(median, cap)):
                    cfg = GenConfig(cost=cost, gpus_per_node=8, planner=plan, start_groups=groups, wide_first=k)
                    rows.setdefault((groups, k, plan is not None), []).append(
                        simulate_generation(cfg, prompts, groups[0]).makespan_s
                    )
    best = statistics.fmean(static_best)
    print(f"\ndefault workload, best static TP {best:.1f} s (mean of {seeds} seeds); heterogeneous starts:")
    print("| start groups | longest on the wide group | static (no merges) | with the planner's merges |")
    print("|---|---|---|---|")
    for groups in STARTS:
        for k in WIDE_FIRST:
            fixed = statistics.fmean(rows[(groups, k, False)])
            merged = statistics.fmean(rows[(groups, k, True)])
            print(
                f"| {'+'.join(map(str, groups))} | {k} | {fixed:.1f} s ({fixed / best - 1:+.1%}) | "
                f"{merged:.1f} s ({merged / best - 1:+.1%}) |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    spec = load_layout_text(builtin_layout_text("qwen3-8b"), [], source="<built-in qwen3-8b>")
    cost = costmodel.from_spec(spec)
    start = time.perf_counter()
    regimes(cost, costmodel.from_spec(verl.layout(spec)), args.seeds)
    heterogeneous(cost, args.seeds)
    print(f"\n{args.seeds} seeds, wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
