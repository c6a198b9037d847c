"""How much any merge schedule could gain: adaptive TP against the best scripted switch schedule in hindsight.

Run: `.venv/bin/python benchmarks/rollout_tp_bound.py [--seeds 20]` (a few minutes on 2 cores). For each seed of
the default workload (one generation step, 8B model on one node of 8 H100s) it simulates every static TP, the
planner (`--adaptive-tp`), and a grid of scripted schedules (start at any tp, then up to three merges of every
block to a wider tp at times on a grid), then reports the best schedule chosen with the true lengths known.
Model-based estimates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.rollout import costmodel  # noqa: E402
from specdraft.rollout.adaptive_tp import PlannerConfig, RemainingPredictor  # noqa: E402
from specdraft.rollout.generation import GenConfig, simulate_generation  # noqa: E402
from specdraft.rollout.workload import LengthModel, synthetic  # noqa: E402
from specdraft.spec.load import builtin_layout_text, load_layout_text  # noqa: E402

TIMES = (1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0)


def schedules(tps):
    """(start tp, ((t, tp), ...)): every chain of up to three merges to ever wider TPs at increasing TIMES."""
    out = []

    def extend(start, chain):
        out.append((start, tuple(chain)))
        last_t, last_tp = chain[-1] if chain else (0.0, start)
        if len(chain) == 3:
            return
        for t in TIMES:
            if t > last_t:
                for tp in tps:
                    if tp > last_tp:
                        extend(start, chain + [(t, tp)])

    for start in tps:
        extend(start, [])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    spec = load_layout_text(builtin_layout_text("qwen3-8b"), [], source="<built-in qwen3-8b>")
    cost = costmodel.from_spec(spec)
    tps = [1, 2, 4, 8]
    start = time.perf_counter()
    rows = []
    print("| seed | best static (tp) | planner | best scripted schedule | planner vs best static | "
          "best scripted vs best static |")
    print("|---|---|---|---|---|---|")
    for seed in range(args.seeds):
        prompts = synthetic(LengthModel(cap=16384), 1, 64, 8, 1024, seed, 0.2)[0]
        static = {tp: simulate_generation(GenConfig(cost=cost, gpus_per_node=8), prompts, tp).makespan_s
                  for tp in tps}
        best_tp = min(static, key=static.get)
        planner = PlannerConfig(predictor=RemainingPredictor(sigma=0.2))
        adaptive = simulate_generation(GenConfig(cost=cost, gpus_per_node=8, planner=planner), prompts, 1).makespan_s
        scripted = min((simulate_generation(GenConfig(cost=cost, gpus_per_node=8, script=sch), prompts, s).makespan_s,
                        s, sch) for s, sch in schedules(tps))
        rows.append((static[best_tp], adaptive, scripted[0]))
        plan = f"tp{scripted[1]} " + " ".join(f"-> tp{tp} at {t:g} s" for t, tp in scripted[2])
        print(f"| {seed} | {static[best_tp]:.1f} (tp {best_tp}) | {adaptive:.1f} | {scripted[0]:.1f}: {plan} | "
              f"{adaptive / static[best_tp] - 1:+.1%} | {scripted[0] / static[best_tp] - 1:+.1%} |")
    best, ad, sc = (statistics.fmean(c) for c in zip(*rows))
    print(f"\nmean over {args.seeds} seeds: best static {best:.1f} s, planner {ad:.1f} s ({ad / best - 1:+.1%}), "
          f"best scripted schedule in hindsight {sc:.1f} s ({sc / best - 1:+.1%}); "
          f"{len(schedules(tps))} schedules per seed, wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
