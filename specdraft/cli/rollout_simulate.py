"""`specdraft rollout simulate`: the rollout schedulers and adaptive TP side by side, its option checks and its
tables (thin; the simulation lives in specdraft.rollout.report.compare). Joins the sub-app from cli/rollout.py."""

from __future__ import annotations

import math
import sys
from typing import List, Optional

import typer

from specdraft.cli.boundary import console as _console
from specdraft.cli.rollout_args import TargetArgs, check_format, check_output, new_table, spec_from_args
from specdraft.spec.bounds import (
    MAX_CHECK_EVERY,
    MAX_LENGTH,
    MAX_SEEDS,
    MAX_SIM_STEPS,
    MAX_SIMULATED_SAMPLES,
    MIN_CHECK_EVERY,
)


def register(rollout_app) -> None:
    """Add `simulate` to the rollout sub-app."""
    rollout_app.command("simulate")(simulate_cmd)


def _number(lo: float, hi: float):
    """A typer callback: the option must be a finite number in [lo, hi] (nan and inf pass click's FloatRange)."""

    def check(value: float | None) -> float | None:
        if value is None:  # not given: the preset's value stands
            return value
        if not (math.isfinite(value) and lo <= value <= hi):
            raise typer.BadParameter(f"{value!r} is not a finite number in [{lo:g}, {hi:g}]")
        return value

    return check


def _tp_size_or_auto(value: str) -> str:
    """`auto` or a TP size of at most four ASCII digits (int() of a 5,000-digit string raises)."""
    if value != "auto" and not (value.isascii() and value.isdigit() and len(value) <= 4):
        raise typer.BadParameter(f"{value[:20]!r} is not auto or a TP size")
    return value


def _input(path: Optional[str], option: str) -> None:
    """An input file must be a regular file: opening a FIFO would wait forever, a device read without end."""
    if path is None:
        return
    import os
    import stat

    from specdraft.errors import UserError
    from specdraft.fsutil import file_kind

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise UserError(
            f"{option} {path!r}: {getattr(err, 'strerror', None) or err}", "pass an existing file"
        ) from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{option} {path} is {file_kind(mode)}, not a regular file", "pass a regular file")


def simulate_cmd(
    args: Optional[List[str]] = TargetArgs,
    seeds: int = typer.Option(5, "--seeds", min=1, max=MAX_SEEDS, help="Seeds to average (95% CI over them)."),
    steps: int = typer.Option(
        4, "--steps", min=1, max=MAX_SIM_STEPS, help="Measured RL steps per seed (rounded up to whole lag+1 periods)."
    ),
    workload: Optional[str] = typer.Option(None, "--workload", help="JSONL of real lengths (docs/rollout.md)."),
    history: Optional[str] = typer.Option(None, "--history", help="JSONL of earlier lengths: predict by prompt id."),
    prediction_error: float = typer.Option(
        0.2, "--prediction-error", callback=_number(0, 10), help="Log-space std of the length predictor."
    ),
    lengths: str = typer.Option(
        "long-tail",
        "--lengths",
        help="Synthetic length preset: long-tail (median 3000) or "
        "deepscaler (DeepScaleR's 8K stage; docs/rollout.md). --median/--sigma/--correlation "
        "override it.",
    ),
    median: Optional[float] = typer.Option(
        None, "--median", callback=_number(1, MAX_LENGTH), help="Median response length (synthetic workload)."
    ),
    sigma: Optional[float] = typer.Option(
        None, "--sigma", callback=_number(0, 10), help="Log-normal sigma (default: p99 = 10x the median)."
    ),
    correlation: Optional[float] = typer.Option(
        None, "--correlation", callback=_number(0, 1), help="Correlation of a prompt's samples' log-lengths."
    ),
    adaptive_tp: bool = typer.Option(False, "--adaptive-tp", help="Also compare static TPs with adaptive TP."),
    tp_overhead_scale: float = typer.Option(
        1.0, "--tp-overhead-scale", callback=_number(0, 1000), help="Scale the reconfiguration overhead."
    ),
    tp_predictor: str = typer.Option("request", "--tp-predictor", help="request or population remaining-length model."),
    check_every: int = typer.Option(
        64,
        "--check-every",
        min=MIN_CHECK_EVERY,
        max=MAX_CHECK_EVERY,
        help="Adaptive TP check-point period in decode steps (the planner runs at each).",
    ),
    tp_start: str = typer.Option(
        "auto",
        "--tp-start",
        callback=_tp_size_or_auto,
        help="Adaptive TP's start: auto (the dry run on predicted lengths picks a TP and "
        "whether to merge) or a TP size.",
    ),
    verl_tp: int = typer.Option(
        2, "--verl-tp", min=1, max=1024, help="Static TP of the verl baseline (VeRL's default: 2)."
    ),
    profile: Optional[str] = typer.Option(None, "--profile", help="Measured decode-step CSV replacing the cost model."),
    format: str = typer.Option("text", "--format", "-f", help="text (rich table) or json."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write a PNG timeline (needs matplotlib)."),
    plot_tp: Optional[str] = typer.Option(
        None,
        "--plot-tp",
        help="With --adaptive-tp: write a PNG of static vs "
        "adaptive TP generation, switch points marked (needs matplotlib).",
    ),
    acceptance_from: Optional[str] = typer.Option(
        None,
        "--acceptance-from",
        metavar="RUN_OR_JSON",
        help="Speculate with a measured draft (`rollout measure --format "
        "json` output, or a run folder's metrics) instead of "
        "rollout.acceptance_rate, and compare with no speculation.",
    ),
) -> None:
    """Simulate verl, fifo, random, sorted, longest_first, asp and the oracle side by side (model-based estimates)."""
    from specdraft.errors import UserError
    from specdraft.rollout.model.workload import LENGTH_PRESETS
    from specdraft.rollout.report.compare import SimulateOptions, run

    check_format(format)
    if lengths not in LENGTH_PRESETS:
        raise UserError(f"--lengths {lengths!r} is not a preset", f"use one of {', '.join(LENGTH_PRESETS)}")
    preset = dict(zip(("median", "sigma", "correlation"), LENGTH_PRESETS[lengths]))
    given = {"median": median, "sigma": sigma, "correlation": correlation}
    shape = {k: preset[k] if v is None else v for k, v in given.items()}
    if plot_tp and not adaptive_tp:
        raise UserError("--plot-tp draws the TP comparison, which needs --adaptive-tp", "add --adaptive-tp")
    check_output(plot, "--plot")
    check_output(plot_tp, "--plot-tp")
    for path, option in ((workload, "--workload"), (history, "--history"), (profile, "--profile")):
        _input(path, option)
    spec = spec_from_args(args)
    samples = spec.rollout.num_prompts_per_step * spec.rollout.num_generations_per_prompt
    if steps * samples > MAX_SIMULATED_SAMPLES:
        # The simulator holds every step's samples of a seed at once (about 2 KB each) and runs ~1 ms per sample.
        raise UserError(
            f"--steps {steps} x {samples:,} samples per step = {steps * samples:,} simulated samples per "
            f"seed; the bound is {MAX_SIMULATED_SAMPLES:,}",
            f"use --steps {max(1, MAX_SIMULATED_SAMPLES // samples)} or fewer",
        )
    opts = SimulateOptions(
        seeds=seeds,
        steps=steps,
        prediction_error=prediction_error,
        lengths=lengths,
        median=shape["median"],
        sigma=shape["sigma"],
        correlation=shape["correlation"],
        workload=workload,
        history=history,
        profile=profile,
        adaptive_tp=adaptive_tp,
        tp_overhead_scale=tp_overhead_scale,
        tp_predictor=tp_predictor,
        check_every_steps=check_every,
        tp_start=tp_start,
        verl_tp=verl_tp,
        timeline=plot is not None or plot_tp is not None,
    )
    from specdraft.cli import measure as measured_draft
    from specdraft.rollout.model.measured import with_measured

    measured = measured_draft.read_measured(acceptance_from, spec) if acceptance_from else None
    report = run(spec if measured is None else with_measured(spec, measured), opts)
    if measured is not None:
        measured_draft.add_speedup(report, spec, opts, measured)
    if plot:
        from specdraft.rollout.report.plot import write_timeline

        write_timeline(plot, report)
    if plot_tp:
        from specdraft.rollout.report.plot import write_tp_timeline

        write_tp_timeline(plot_tp, report)
    if format == "json":
        import json

        sys.stdout.write(json.dumps({k: v for k, v in report.data.items()}, indent=2) + "\n")
        return
    _print_simulation(_console(), report.data)
    if measured is not None:
        measured_draft.print_speedup(_console(), report.data["acceptance_from"])
    for path in (plot, plot_tp):
        if path:
            _console().print(f"wrote {path}", markup=False)


def _print_simulation(console, data: dict) -> None:
    pols = data["policies"]
    title = (
        f"rollout policies on {data['layout']}: {data['instances']} instances x tp {data['tp']}, "
        f"{'colocated' if data['colocated'] else 'dedicated'}, {data['seeds']} seeds x "
        f"{data['measured_steps']} steps, prediction error {data['prediction_error']:g} (model-based estimates)"
    )
    verl = data.get("verl")
    marks = {"oracle": " (upper bound)", "verl": f" (tp {verl['tp']})" if verl else ""}
    table = new_table(title, ["metric", *[p + marks.get(p, "") for p in pols]])

    def row(name, fn):
        table.add_row(name, *[fn(rec) for rec in pols.values()])

    row("iteration time s", lambda r: f"{r['iteration_time_s']['mean']:.1f} ± {r['iteration_time_s']['ci95']:.1f}")
    if "fifo" in pols:
        row("vs fifo", lambda r: f"{r['vs_fifo']:+.1%}")
    row("generation makespan s", lambda r: f"{r['makespan_s']['mean']:.1f}")
    for kind in ("padding", "skewness", "sorting"):
        row(f"{kind} bubble", lambda r, k=kind: f"{r['bubbles'][k]:.1%}")
    row("tokens/s per GPU", lambda r: f"{r['tokens_per_gpu_s']:,.0f}")
    row("trainer idle s/iter", lambda r: f"{r['trainer_idle_s']:.1f}")
    row("policy lag max / mean", lambda r: f"{r['max_policy_lag']} / {r['mean_policy_lag']:.2f}")
    console.print(table)
    gen = data.get("generation")
    if not gen:
        return
    t2 = new_table(
        "generation of one step: the verl baseline, static TP and adaptive TP (model-based)",
        ["config", "makespan s", "x verl", "x best static"],
    )
    best = gen["best_static_tp"]["makespan_s"]["mean"]
    base = gen["verl"]["makespan_s"]["mean"]

    def add(label, mk):
        t2.add_row(
            label, f"{mk['mean']:.1f} ± {mk['ci95']:.1f}", f"{mk['mean'] / base:.3f}x", f"{mk['mean'] / best:.3f}x"
        )

    v = gen["verl"]
    add(
        f"verl: static tp {v['tp']}, even split, memory {v['gpu_memory_utilization']:g}, max_num_seqs "
        f"{v['max_num_seqs']}",
        v["makespan_s"],
    )
    for tp, rec in gen["static"].items():
        add(
            f"static tp {tp}" + (" (best in hindsight)" if int(tp) == gen["best_static_tp"]["tp"] else ""),
            rec["makespan_s"],
        )
    ad = gen["adaptive"]
    add(f"adaptive from tp {ad['start_tp']}", ad["makespan_s"])
    console.print(t2)
    console.print(
        f"adaptive: {ad['switches_per_run']:.1f} switches per run, {ad['overhead_s']:.2f} s overhead, "
        f"{ad['vs_layout_tp']:+.1%} vs static tp {gen['layout_tp']}; speculation pays up to batch "
        + ", ".join(f"{v} at tp {k}" for k, v in gen["speculation_below_batch"].items())
    )
    for sw in ad["switches"]:
        moves = [m["action"] for m in sw["requests"]]
        console.print(
            f"  t={sw['time_s']:.1f}s node {sw['node']}: "
            + " + ".join(f"tp{g['tp']}{g['gpus']}" for g in sw["from"])
            + f" -> tp{sw['to']['tp']}{sw['to']['gpus']} ({sw['to']['running']} running; "
            f"{moves.count('migrate')} migrate, {moves.count('recompute')} recompute; overhead "
            f"{sw['overhead_s']['total']:.2f}s; predicted {sw['predicted_makespan_s']['stay']:.1f}s -> "
            f"{sw['predicted_makespan_s']['switch']:.1f}s)"
        )
