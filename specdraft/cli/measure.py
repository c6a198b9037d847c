"""`specdraft rollout measure RUN`: real speculative decoding with a run's own policy and draft, against plain greedy
decoding in the same process, by the built-in engine or by vLLM serving the run's exports (thin; the work is
runtime/serve/measure.py, run in a subprocess); and the measured draft in `rollout simulate --acceptance-from` (the
model is rollout/model/measured.py)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from specdraft.cli.boundary import console as _console
from specdraft.cli.terminal import plain, safe
from specdraft.spec.engines import ENGINE_KINDS


def measure_cmd(
    run: str = typer.Argument(..., metavar="RUN", help="A run folder's path, or its name under runs/."),
    step: Optional[int] = typer.Option(None, "--step", help="The policy's checkpoint step (default: the newest)."),
    draft_step: Optional[int] = typer.Option(
        None,
        "--draft-step",
        help="The draft's checkpoint step (default: --step's); an older one measures a stale draft.",
    ),
    k: int = typer.Option(3, "--k", help="Draft tokens per verify step."),
    prompts: int = typer.Option(8, "--prompts", help="Held-out prompts to decode."),
    prompt_length: int = typer.Option(16, "--prompt-length", help="Tokens per prompt."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Tokens to generate per prompt."),
    format: str = typer.Option("text", "--format", "-f", help="text (a table) or json."),
    engine: str = typer.Option(
        "builtin",
        "--engine",
        help="builtin (specdraft's own decode) or vllm (vLLM serving the run's policy and draft exports).",
    ),
) -> None:
    """Measure lossless speculative decoding (accept length, tokens per target forward, wall-clock speedup)."""
    import json

    from specdraft.errors import UserError
    from specdraft.execute import monitor, payload
    from specdraft.runs.rundir import resolve_run

    if format not in ("text", "json"):
        raise UserError(f"--format {format!r} is not supported", "use --format text or --format json")
    if engine not in ENGINE_KINDS:
        raise UserError(
            f"--engine {engine!r} is not supported", "use " + " or ".join(f"--engine {kind}" for kind in ENGINE_KINDS)
        )
    for option, value in (
        ("--k", k),
        ("--prompts", prompts),
        ("--prompt-length", prompt_length),
        ("--max-new-tokens", max_new_tokens),
    ):
        if not 1 <= value <= 1 << 16:
            raise UserError(f"{option} {value}: must be in 1..65536", f"e.g. {option} {3 if option == '--k' else 8}")
    for option, chosen in (("--step", step), ("--draft-step", draft_step)):
        if chosen is not None and chosen < 0:
            raise UserError(f"{option} {chosen}: a checkpoint step is >= 0", f"drop {option} for the newest")
    folder, _, _ = resolve_run(run)
    _, plan_sha256 = monitor.verified_plan(folder)  # the payload reads exactly these bytes
    payload.require_runtime("rollout measure")
    argv = [
        str(folder),
        "--plan-sha256",
        plan_sha256,
        "--k",
        str(k),
        "--prompts",
        str(prompts),
        "--prompt-length",
        str(prompt_length),
        "--max-new-tokens",
        str(max_new_tokens),
        "--engine",
        engine,
    ]
    argv += ["--step", str(step)] if step is not None else []
    argv += ["--draft-step", str(draft_step)] if draft_step is not None else []
    err = _console(stderr=True)
    result = json.loads(payload.run("serve.measure", argv, lambda line: err.print(plain(line), markup=False)))
    if format == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    _print(result)


def _print(r: dict) -> None:
    from rich.table import Table

    engine = safe(r.get("engine", "builtin"))
    table = Table(
        title=f"speculative decoding, measured by {engine}: {safe(r['run'])} (policy step {safe(r['target_step'])}, "
        f"draft step {safe(r['draft_step'])}, k {r['k']}, {r['prompts']} prompts x {r['max_new_tokens']} tokens, "
        f"{safe(r['device'])})"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    accept = " ".join(f"{a:.3f}" for a in r["acceptance"])
    for name, value in (
        ("accept_len (tokens per verify step)", f"{r['accept_len']:.3f}"),
        ("tokens per target forward (prefill included)", f"{r['tokens_per_target_forward']:.3f}"),
        ("acceptance (>= i+1 drafts accepted)", accept),
        ("lossless (= plain greedy decoding)", str(r["lossless"])),
        ("wall-clock speedup vs plain greedy", _figure(r["speedup_wall"], "{:.2f}x")),
        (
            "tokens/s plain / speculative",
            f"{_figure(r.get('plain_tokens_per_s'))} / {_figure(r.get('speculative_tokens_per_s'))}",
        ),
        ("draft vocabulary", f"{r['draft_vocab_size']:,} of {r['vocab_size']:,}"),
    ):
        table.add_row(name, value)
    _console().print(table)


def _figure(value, form: str = "{:.1f}") -> str:
    return "n/a" if value is None else form.format(value)


def read_measured(path: str, spec):
    """The measured draft behind --acceptance-from (a JSON file, a run folder, or a run's name under runs/)."""
    import os

    from specdraft.errors import UserError
    from specdraft.rollout.model import measured

    if not spec.draft.enabled:
        raise UserError(
            "--acceptance-from speculates with a draft, but the layout has draft.enabled=false",
            "use a layout with a draft",
        )
    if not os.path.exists(path):
        from specdraft.runs.rundir import resolve_run

        path = str(resolve_run(path)[0])
    return measured.read(path)


def add_speedup(report, spec, opts, draft) -> None:
    """The same simulation without speculation, and the ratios: what the measured draft buys in this model."""
    from dataclasses import replace

    from specdraft.rollout.model.measured import speedups, without_speculation
    from specdraft.rollout.report.compare import run

    none = run(without_speculation(spec), replace(opts, adaptive_tp=False, timeline=False))
    report.data["acceptance_from"] = {
        **draft.to_dict(),
        "speedup": speedups(report.data, none.data),
        "measured": "accept_len at k ("
        + (
            "real greedy speculative decoding with the run's policy and draft"
            if draft.kind == "decoding"
            else "the training-time test's top-1 agreement on training rows"
        )
        + ")",
        "modelled": "decode and verify step costs, batching, KV capacity, the trainer (the calibrated cost model); "
        "per-token acceptance a solved from accept_len = (1 - a^(k+1)) / (1 - a)",
        "acceptance_rate_replaced": spec.rollout.acceptance_rate,
        "num_speculative_tokens": draft.k,  # what with_measured puts in the simulated spec
    }


def print_speedup(console, data: dict) -> None:
    from rich.table import Table

    table = Table(
        title=f"measured draft ({data['kind']}: {safe(data['source'])}): accept_len {data['accept_len']:.3f} at k "
        f"{data['k']} -> per-token acceptance {data['per_token_acceptance']:.3f} (spec: "
        f"{data['acceptance_rate_replaced']:.2f}); projected, model-based"
    )
    for column in (
        "policy",
        "iteration s none / spec",
        "iteration speedup",
        "makespan s none / spec",
        "generation speedup",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, rec in data["speedup"].items():
        table.add_row(
            policy,
            f"{rec['iteration_time_s']['none']:.1f} / {rec['iteration_time_s']['speculative']:.1f}",
            f"{rec['iteration_speedup']:.2f}x",
            f"{rec['makespan_s']['none']:.1f} / {rec['makespan_s']['speculative']:.1f}",
            f"{rec['generation_speedup']:.2f}x",
        )
    console.print(table)
    console.print(f"measured: {data['measured']}; modelled: {data['modelled']}", markup=False)


def register(rollout_app) -> None:
    rollout_app.command("measure")(measure_cmd)
