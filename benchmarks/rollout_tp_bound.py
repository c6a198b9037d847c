"""How much any merge schedule could gain: adaptive TP against the best scripted switch schedule in hindsight.

Run: `.venv/bin/python benchmarks/rollout_tp_bound.py [--seeds 20] [--layout FILE --lengths PRESET]` (minutes on 2
cores; the paper-like layouts take about 2 minutes a seed). For each seed (one generation step of the layout's
workload) it simulates every static TP, the verl baseline, the planner as `simulate --adaptive-tp` runs it, and a
grid of scripted schedules (start at any TP, then up to three merges of every block to a wider TP, at fractions of
the best static makespan), then reports the best schedule chosen with the true lengths known. Model-based estimates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.rollout.model.profile import valid_tps
from specdraft.rollout.model.workload import LENGTH_PRESETS, LengthModel, synthetic
from specdraft.rollout.report.compare import SimulateOptions, cost_model, run
from specdraft.rollout.sim.generation import GenConfig, simulate_generation
from specdraft.spec.load import load_layout

FRACTIONS = (0.01, 0.02, 0.035, 0.06, 0.085, 0.11, 0.17, 0.23, 0.29, 0.34, 0.46, 0.57, 0.68, 0.8, 0.91, 1.0)


def schedules(tps, times):
    """(start tp, ((t, tp), ...)): every chain of up to three merges to ever wider TPs at increasing times."""
    out = []

    def extend(start, chain):
        out.append((start, tuple(chain)))
        last_t, last_tp = chain[-1] if chain else (0.0, start)
        if len(chain) == 3:
            return
        for t in times:
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
    parser.add_argument("--layout", default="layouts/qwen3-8b.yaml")
    parser.add_argument("--lengths", default="long-tail", choices=sorted(LENGTH_PRESETS))
    args = parser.parse_args()
    spec = load_layout(args.layout)
    r = spec.rollout
    median, sigma, correlation = LENGTH_PRESETS[args.lengths]
    tps = valid_tps(spec)
    cost = cost_model(spec, None, tps)
    gpus = spec.cluster.gpus_per_node
    start = time.perf_counter()
    rows = []
    print(
        "| seed | best static (tp) | verl | planner | best scripted schedule | planner x best static | "
        "best scripted x best static | best scripted x verl |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for seed in range(args.seeds):
        opts = SimulateOptions(
            seeds=1,
            steps=1,
            policies=(),
            adaptive_tp=True,
            lengths=args.lengths,
            median=median,
            sigma=sigma,
            correlation=correlation,
        )
        # `simulate --adaptive-tp` on this seed alone: the static TPs, verl and the planner, as docs/rollout.md reports.
        gen = run(spec, replace(opts, first_seed=seed)).data["generation"]
        best_tp, best = gen["best_static_tp"]["tp"], gen["best_static_tp"]["makespan_s"]["mean"]
        verl, planner = gen["verl"]["makespan_s"]["mean"], gen["adaptive"]["makespan_s"]["mean"]
        model = LengthModel(median=median, sigma=sigma, cap=r.max_response_length, correlation=correlation)
        prompts = synthetic(model, 1, r.num_prompts_per_step, r.num_generations_per_prompt, r.prompt_length, seed, 0.2)[
            0
        ]
        times = [round(f * best, 3) for f in FRACTIONS]
        scripted = min(
            (simulate_generation(GenConfig(cost=cost, gpus_per_node=gpus, script=sch), prompts, s).makespan_s, s, sch)
            for s, sch in schedules(tps, times)
        )
        rows.append((best, verl, planner, scripted[0]))
        plan = f"tp{scripted[1]} " + " ".join(f"-> tp{tp} at {t:g} s" for t, tp in scripted[2])
        print(
            f"| {seed} | {best:.1f} (tp {best_tp}) | {verl:.1f} | {planner:.1f} | {scripted[0]:.1f}: {plan} | "
            f"{planner / best:.3f}x | {scripted[0] / best:.3f}x | {scripted[0] / verl:.3f}x |",
            flush=True,
        )
    best, verl, planner, scripted = (statistics.fmean(c) for c in zip(*rows))
    print(
        f"\nmean over {args.seeds} seeds ({spec.name}, --lengths {args.lengths}): best static {best:.1f} s, verl "
        f"{verl:.1f} s, planner {planner:.1f} s ({planner / best:.3f}x best static, {planner / verl:.3f}x verl), "
        f"best scripted schedule in hindsight {scripted:.1f} s ({scripted / best:.3f}x best static, "
        f"{scripted / verl:.3f}x verl); {len(schedules(tps, FRACTIONS))} schedules per seed, "
        f"wall {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
