"""Rollout commands: `specdraft rollout plan | simulate | profile` (thin; the logic lives in specdraft.rollout)."""

from __future__ import annotations

import math
import sys
from typing import List, Optional

import typer

from specdraft.cli.args import target_args, typer_app
from specdraft.cli.boundary import console as _console
from specdraft.spec.bounds import (
    MAX_CHECK_EVERY,
    MAX_LENGTH,
    MAX_SEEDS,
    MAX_SIM_STEPS,
    MAX_SIMULATED_SAMPLES,
    MIN_CHECK_EVERY,
)

rollout_app = typer_app(
    "rollout", "Plan rollout instances, simulate the rollout schedulers and adaptive TP, profile decode steps."
)

TargetArgs = target_args("the built-in qwen3-8b rollout layout")


def register(app) -> None:
    """Add the rollout sub-app to ``app``."""
    app.add_typer(rollout_app, name="rollout")


def _spec(args):
    from specdraft.cli.args import split_target
    from specdraft.rollout.report.overview import load

    path, overrides = split_target(args)
    return load(path, overrides)


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


def _output(path: Optional[str], option: str, stdout_ok: bool = False) -> None:
    """Refuse a non-regular-file target before any work is done (the write itself checks again)."""
    if path is None:
        return
    from specdraft.errors import UserError
    from specdraft.fsutil import STDOUT, check_output_path

    if path == STDOUT and not stdout_ok:
        raise UserError(f"{option} writes a PNG image, not text for standard output", f"give {option} a file name")
    if path != STDOUT:
        check_output_path(path, option)


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


def _format(value: str) -> None:
    from specdraft.errors import UserError

    if value not in ("text", "json"):
        raise UserError(f"--format {value!r} is not supported", "use --format text or --format json")


@rollout_app.command("plan")
def plan_cmd(
    args: Optional[List[str]] = TargetArgs,
    format: str = typer.Option("text", "--format", "-f", help="text (rich tables) or json."),
) -> None:
    """Show the rollout instances, their vLLM settings and a model-based estimate of one instance."""
    from specdraft.rollout.report.overview import plan_overview

    _format(format)
    data = plan_overview(_spec(args))
    if format == "json":
        import json

        from specdraft.plan.codec import encode_value

        sys.stdout.write(json.dumps(encode_value(data), indent=2) + "\n")
        return
    _print_plan(_console(), data)


@rollout_app.command("simulate")
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

    _format(format)
    if lengths not in LENGTH_PRESETS:
        raise UserError(f"--lengths {lengths!r} is not a preset", f"use one of {', '.join(LENGTH_PRESETS)}")
    preset = dict(zip(("median", "sigma", "correlation"), LENGTH_PRESETS[lengths]))
    given = {"median": median, "sigma": sigma, "correlation": correlation}
    shape = {k: preset[k] if v is None else v for k, v in given.items()}
    if plot_tp and not adaptive_tp:
        raise UserError("--plot-tp draws the TP comparison, which needs --adaptive-tp", "add --adaptive-tp")
    _output(plot, "--plot")
    _output(plot_tp, "--plot-tp")
    for path, option in ((workload, "--workload"), (history, "--history"), (profile, "--profile")):
        _input(path, option)
    spec = _spec(args)
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
        **shape,
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


@rollout_app.command("profile")
def profile_cmd(
    args: Optional[List[str]] = TargetArgs,
    csv: Optional[str] = typer.Option(
        None,
        "--csv",
        help="Also write the table as CSV (atomically; a "
        "regular file only), or only the CSV to standard output with "
        "`--csv -`.",
    ),
) -> None:
    """Per-step decode latency by (tp, batch, context) from the cost model; the CSV format --profile reads."""
    from specdraft.fsutil import STDOUT, write_output
    from specdraft.rollout.model.costmodel import from_spec
    from specdraft.rollout.model.profile import table_rows, to_csv, valid_tps

    _output(csv, "--csv", stdout_ok=True)
    spec = _spec(args)
    cost = from_spec(spec)
    rows = table_rows(cost, valid_tps(spec))
    if csv:
        write_output(csv, to_csv(rows), "--csv")
    if csv == STDOUT:
        return  # the CSV is the output; tables next to it would corrupt it
    _print_profile(_console(), spec.name, rows)
    from specdraft.rollout.model.profile import calibration_rows

    # The published anchors: microsoft/vidur's H100 profiles, vLLM's custom all-reduce as SGLang PR #2904 measures it.
    title = f"calibration against published figures: vidur, SGLang PR #2904 ({spec.cluster.gpu}, model-based)"
    table = _table(title, ["anchor", "published", "model"])
    for row in calibration_rows(cost):
        table.add_row(*row)
    _console().print(table)
    if csv:
        _console().print(f"wrote {csv}", markup=False)


# ---- rendering (rich tables only; every number comes from specdraft.rollout) --------------------------------
def _table(title: str, columns: list[str], right: bool = True):
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if right and i else "left")
    return table


def _print_plan(console, data: dict) -> None:
    from rich.markup import escape

    plan, typ = data["plan"], data["typical"]
    kv = plan.kv
    gib = 2**30
    settings = _table("rollout settings", ["setting", "value"])
    for name, value in (
        (
            "instances x tp",
            f"{plan.num_instances} x {plan.tp} ({plan.num_gpus} GPUs, "
            f"{'colocated with training' if plan.colocated else 'dedicated nodes'})",
        ),
        ("samples per step", str(plan.samples_per_step)),
        ("max policy lag", str(plan.max_policy_lag)),
        (
            "speculative",
            f"{'eagle3, k=' + str(plan.num_speculative_tokens) if plan.speculative else 'off'}"
            f", acceptance {plan.acceptance_rate:.2f} -> {data['expected_accepted_tokens']:.2f} "
            "tokens/verify",
        ),
        ("speculation pays up to batch", str(data["speculation_below_batch"])),
        ("max_model_len", str(data["max_model_len"])),
        (
            "weights per GPU",
            f"{kv.weights_bytes_per_gpu / gib:.1f} GiB (target "
            f"{kv.target_weights_bytes_per_gpu / gib:.1f} + draft "
            f"{kv.draft_weights_bytes_per_gpu / gib:.1f})",
        ),
        (
            "KV budget per GPU",
            f"{kv.kv_bytes_per_gpu / gib:.1f} GiB, {kv.max_full_length_sequences} full-length sequences",
        ),
        ("KV capacity per instance", f"{data['kv_capacity_tokens']:,} tokens (after target + draft weights)"),
    ):
        settings.add_row(name, value)
    console.print(settings)
    inst = _table("instances", ["instance", "node", "local GPUs", "training ranks"])
    for i in plan.instances:
        inst.add_row(
            str(i.instance),
            str(i.node),
            " ".join(map(str, i.local_gpus)),
            " ".join(map(str, i.training_ranks or ())) or "-",
        )
    console.print(inst)
    for note in data["training_notes"]:
        console.print(f"[yellow]training side (not rollout):[/] {escape(note)} - see `specdraft validate`")
    console.print(
        f"model-based estimate: batch {typ['batch']} at {typ['context']} context tokens -> "
        f"{typ['decode_step_s'] * 1e3:.1f} ms per {'verify' if typ['speculating'] else 'decode'} step, "
        f"{typ['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU; one {typ['minibatch_samples']}-sample "
        f"training minibatch ~{typ['training_minibatch_s']:.1f} s"
    )


def _print_simulation(console, data: dict) -> None:
    pols = data["policies"]
    title = (
        f"rollout policies on {data['layout']}: {data['instances']} instances x tp {data['tp']}, "
        f"{'colocated' if data['colocated'] else 'dedicated'}, {data['seeds']} seeds x "
        f"{data['measured_steps']} steps, prediction error {data['prediction_error']:g} (model-based estimates)"
    )
    verl = data.get("verl")
    marks = {"oracle": " (upper bound)", "verl": f" (tp {verl['tp']})" if verl else ""}
    table = _table(title, ["metric", *[p + marks.get(p, "") for p in pols]])

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
    t2 = _table(
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


def _print_profile(console, name: str, rows: list[dict]) -> None:
    contexts = sorted({r["context"] for r in rows})
    for tp in sorted({r["tp"] for r in rows}):
        table = _table(
            f"{name}: decode step ms at tp {tp} (plain / speculative verify), by batch and context",
            ["batch", *[f"ctx {c}" for c in contexts]],
        )
        for batch in sorted({r["batch"] for r in rows if r["tp"] == tp}):
            cells = {r["context"]: r for r in rows if r["tp"] == tp and r["batch"] == batch}
            table.add_row(
                str(batch),
                *[
                    f"{cells[c]['decode_s'] * 1e3:.2f}"
                    + (
                        f" / {cells[c]['speculative_decode_s'] * 1e3:.2f}"
                        if cells[c]["speculative_decode_s"] is not None
                        else ""
                    )
                    for c in contexts
                ],
            )
        console.print(table)
