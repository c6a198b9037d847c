"""The model-based figures of docs/rollout.md: policies, prediction-error and overhead sweeps, over many seeds.

Run: `.venv/bin/python benchmarks/rollout_sweep.py [--seeds 20]` (about 20 minutes on 2 cores). Prints markdown
tables: the policies on the shipped and the paper-like layouts, asp against prediction error, the adaptive TP sweeps
and the paper-like regimes. Every figure is a simulator estimate (mean +- 95% CI over seeds), not a measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.rollout.model.workload import LENGTH_PRESETS
from specdraft.rollout.report.compare import SimulateOptions, run
from specdraft.spec.load import builtin_layout_text, load_layout, load_layout_text

DEDICATED = ["rollout.colocated=false", "rollout.num_nodes=1"]
PAT_LAYOUTS = ("layouts/llama3.1-8b-pat.yaml", "layouts/qwen3-14b-pat.yaml")


def layout(overrides=()):
    return load_layout_text(builtin_layout_text("qwen3-8b"), list(overrides), source="<built-in qwen3-8b>")


def fmt(ci: dict) -> str:
    return f"{ci['mean']:.1f} ± {ci['ci95']:.1f}"


def policies_table(title: str, data: dict) -> None:
    pols = data["policies"]
    verl = data.get("verl")
    marks = {"oracle": " (upper bound)", "verl": f" (tp {verl['tp']}, VeRL's engine)" if verl else ""}
    print(f"\n### {title}\n")
    print(
        "| policy | iteration s | x fifo | makespan s | padding | skewness | sorting | tok/s/GPU | trainer idle s "
        "| lag max/mean |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in pols.items():
        b = r["bubbles"]
        print(
            f"| {name}{marks.get(name, '')} | {fmt(r['iteration_time_s'])} | "
            f"{1 + r['vs_fifo']:.3f}x | {r['makespan_s']['mean']:.1f} | {b['padding']:.1%} | {b['skewness']:.1%} | "
            f"{b['sorting']:.1%} | {r['tokens_per_gpu_s']:,.0f} | {r['trainer_idle_s']:.1f} | "
            f"{r['max_policy_lag']}/{r['mean_policy_lag']:.2f} |"
        )
    if "asp" in pols and "oracle" in pols:
        gap = pols["asp"]["vs_fifo"] - pols["oracle"]["vs_fifo"]
        print(
            f"\nasp {1 + pols['asp']['vs_fifo']:.3f}x fifo, oracle {1 + pols['oracle']['vs_fifo']:.3f}x: "
            f"asp is {gap:.3f} from the oracle"
        )


def generation_table(data: dict) -> None:
    gen = data["generation"]
    best = gen["best_static_tp"]["makespan_s"]["mean"]
    verl = gen["verl"]["makespan_s"]["mean"]
    print("\n| generation config | makespan s | x verl | x best static |")
    print("|---|---|---|---|")
    v = gen["verl"]
    print(
        f"| verl (static tp {v['tp']}, even split, memory {v['gpu_memory_utilization']:g}, max_num_seqs "
        f"{v['max_num_seqs']}) | {fmt(v['makespan_s'])} | 1.000x | {verl / best:.3f}x |"
    )
    for tp, rec in gen["static"].items():
        mark = " (best in hindsight)" if int(tp) == gen["best_static_tp"]["tp"] else ""
        layout_mark = " (the layout's)" if int(tp) == gen["layout_tp"] else ""
        mean = rec["makespan_s"]["mean"]
        print(
            f"| static tp {tp}{layout_mark}{mark} | {fmt(rec['makespan_s'])} | {mean / verl:.3f}x | "
            f"{mean / best:.3f}x |"
        )
    ad = gen["adaptive"]
    print(
        f"| **adaptive (from tp {ad['start_tp']})** | **{fmt(ad['makespan_s'])}** | **{ad['x_verl']:.3f}x** | "
        f"**{ad['x_best_static']:.3f}x** |"
    )
    print(
        f"\nadaptive: {ad['switches_per_run']:.1f} switches/run, {ad['overhead_s']:.2f} s overhead/run, "
        f"worst seed {ad['worst_seed_x']['verl']:.3f}x verl and {ad['worst_seed_x']['best_static']:.3f}x the best "
        f"static TP; {ad['vs_layout_tp']:+.1%} vs static tp {gen['layout_tp']}; speculation pays up to batch "
        f"{gen['speculation_below_batch']}"
    )


def sweep_row(label: str, gen: dict) -> None:
    ad = gen["adaptive"]
    best = gen["best_static_tp"]
    worst = ad["worst_seed_x"]
    print(
        f"| {label} | {fmt(ad['makespan_s'])} | {best['makespan_s']['mean']:.1f} (tp {best['tp']}) | "
        f"{ad['x_best_static']:.3f}x ({worst['best_static']:.3f}x) | {gen['verl']['makespan_s']['mean']:.1f} | "
        f"{ad['x_verl']:.3f}x ({worst['verl']:.3f}x) | {ad['switches_per_run']:.1f} | {ad['overhead_s']:.2f} |"
    )


SWEEP_HEADER = (
    "| setting | adaptive makespan s | best static s (tp) | x best static (worst seed) | verl s | "
    "x verl (worst seed) | switches/run | overhead s/run |\n|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    seeds = args.seeds
    start = time.perf_counter()

    print(f"## policies, {seeds} seeds, prediction error 0.2")
    data = run(layout(), SimulateOptions(seeds=seeds, adaptive_tp=True)).data
    policies_table(
        f"qwen3-8b (colocated, 8 x TP1 on 8 H100s): `specdraft rollout simulate --seeds {seeds} --adaptive-tp`", data
    )
    generation_table(data)
    for title, overrides in (("dedicated rollout node (8 x TP1) + 8 training GPUs", DEDICATED),):
        other = run(layout(overrides), SimulateOptions(seeds=seeds)).data
        policies_table(f"{title}: `specdraft rollout simulate --seeds {seeds} {' '.join(overrides)}`", other)

    print(f"\n## asp vs prediction error ({seeds} seeds, colocated)\n")
    print("| --prediction-error | layout | asp vs fifo | asp vs oracle | asp vs sorted |")
    print("|---|---|---|---|---|")
    for overrides in ([],):
        for err in (0.0, 0.1, 0.2, 0.4, 0.8):
            pols = run(
                layout(overrides),
                SimulateOptions(seeds=seeds, prediction_error=err, policies=("fifo", "sorted", "asp", "oracle")),
            ).data
            it = {k: v["iteration_time_s"]["mean"] for k, v in pols["policies"].items()}
            print(
                f"| {err} | {' '.join(overrides) or 'shipped'} | {it['asp'] / it['fifo'] - 1:+.1%} | "
                f"{it['asp'] / it['oracle'] - 1:+.1%} | {it['asp'] / it['sorted'] - 1:+.1%} |"
            )

    print(f"\n## adaptive TP sweeps ({seeds} seeds, one generation step of the default workload)\n")
    print(SWEEP_HEADER)
    sweeps = [("--tp-overhead-scale", {"tp_overhead_scale": x}) for x in (0.5, 1.0, 2.0, 4.0)]
    sweeps += [("--prediction-error", {"prediction_error": x}) for x in (0.0, 0.2, 0.5, 1.0)]
    sweeps += [("--check-every", {"check_every_steps": x}) for x in (16, 256)]
    sweeps += [("--tp-predictor population", {"tp_predictor": "population"}), ("--tp-start 2", {"tp_start": "2"})]
    sweeps += [("rollout.speculative=false", {}), ("rollout.acceptance_rate=0.5", {})]
    for label, kw in sweeps:
        overrides = [label] if "=" in label else []
        gen = run(layout(overrides), SimulateOptions(seeds=seeds, steps=1, policies=(), adaptive_tp=True, **kw)).data[
            "generation"
        ]
        value = "" if overrides or " " in label else f" {next(iter(kw.values()))}"
        sweep_row(f"{label}{value}", gen)

    print(f"\n## paper-like regimes ({seeds} seeds, `--lengths deepscaler`)\n")
    m, sg, c = LENGTH_PRESETS["deepscaler"]
    for path in PAT_LAYOUTS:
        opts = SimulateOptions(
            seeds=seeds,
            adaptive_tp=True,
            lengths="deepscaler",
            median=m,
            sigma=sg,
            correlation=c,
            policies=("verl", "fifo", "sorted", "longest_first", "asp", "oracle"),
        )
        data = run(load_layout(path), opts).data
        policies_table(
            f"{Path(path).stem}: `specdraft rollout simulate {path} --lengths deepscaler --seeds {seeds} "
            "--adaptive-tp`",
            data,
        )
        generation_table(data)

    print(f"\n(sweep wall time {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
