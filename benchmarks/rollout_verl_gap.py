"""Where the gap to the verl baseline comes from: engine settings, dispatch, TP choice and adaptivity, step by step.

Run: `.venv/bin/python benchmarks/rollout_verl_gap.py [--seeds 20]` (about 10 minutes on 2 cores). For the default
layout and the two paper-like layouts it generates one step per seed under five configurations, each changing one
thing from the one before: (a) the verl baseline (VeRL's TP 2, gpu_memory_utilization 0.5 and max_num_seqs 1024,
the batch split evenly); (b) the same split and TP on the layout's engine settings; (c) the layout's
longest-processing-time dispatch on predicted lengths; (d) the best static TP in hindsight; (e) adaptive TP as
`simulate --adaptive-tp` runs it. Model-based estimates, mean makespan over seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.rollout.model.workload import LENGTH_PRESETS, LengthModel, synthetic
from specdraft.rollout.report.compare import SimulateOptions, cost_model, run
from specdraft.rollout.schedule import verl
from specdraft.rollout.sim.generation import GenConfig, simulate_generation
from specdraft.spec.load import load_layout

REGIMES = (
    ("layouts/qwen3-8b.yaml", "long-tail"),
    ("layouts/llama3.1-8b-pat.yaml", "deepscaler"),
    ("layouts/qwen3-14b-pat.yaml", "deepscaler"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    start = time.perf_counter()
    print(
        "| layout | (a) verl | (b) + layout's engine | (c) + LPT dispatch | (d) + best static TP | (e) adaptive | "
        "(e) / (a) |"
    )
    print("|---|---|---|---|---|---|---|")
    for path, lengths in REGIMES:
        spec = load_layout(path)
        r, gpus = spec.rollout, spec.cluster.gpus_per_node
        median, sigma, correlation = LENGTH_PRESETS[lengths]
        opts = SimulateOptions(
            seeds=args.seeds,
            steps=1,
            policies=(),
            adaptive_tp=True,
            lengths=lengths,
            median=median,
            sigma=sigma,
            correlation=correlation,
        )
        gen = run(spec, opts).data["generation"]
        cost = cost_model(spec, None, [verl.VERL_TP])
        model = LengthModel(median=median, sigma=sigma, cap=r.max_response_length, correlation=correlation)
        even = []
        for seed in range(args.seeds):
            prompts = synthetic(
                model,
                1,
                r.num_prompts_per_step,
                r.num_generations_per_prompt,
                r.prompt_length,
                seed,
                opts.prediction_error,
            )[0]
            cfg = GenConfig(cost=cost, gpus_per_node=gpus, dispatch="even")
            even.append(simulate_generation(cfg, prompts, verl.VERL_TP).makespan_s)
        a = gen["verl"]["makespan_s"]["mean"]
        b = statistics.fmean(even)
        c = gen["static"][str(verl.VERL_TP)]["makespan_s"]["mean"]
        d = gen["best_static_tp"]["makespan_s"]["mean"]
        e = gen["adaptive"]["makespan_s"]["mean"]
        best_tp = gen["best_static_tp"]["tp"]
        print(
            f"| {spec.name} (--lengths {lengths}) | {a:.1f} s | {b:.1f} s ({b / a:.3f}x) | {c:.1f} s "
            f"({c / a:.3f}x) | {d:.1f} s, tp {best_tp} ({d / a:.3f}x) | {e:.1f} s ({e / a:.3f}x) | {e / a:.3f}x |",
            flush=True,
        )
    print(f"\n{args.seeds} seeds, wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
