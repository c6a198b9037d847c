"""Rollout commands: `specdraft rollout plan | simulate | profile` (thin; the logic lives in specdraft.rollout)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from specdraft.cli.args import typer_app
from specdraft.cli.boundary import console as _console
from specdraft.cli.rollout_args import TargetArgs, check_format, check_output, new_table, spec_from_args

rollout_app = typer_app(
    "rollout", "Plan rollout instances, simulate the rollout schedulers and adaptive TP, profile decode steps."
)


def register(app) -> None:
    """Add the rollout sub-app to ``app``: plan, simulate (cli/rollout_simulate.py) and profile, in that order."""
    from specdraft.cli import rollout_simulate

    rollout_app.command("plan")(plan_cmd)
    rollout_simulate.register(rollout_app)
    rollout_app.command("profile")(profile_cmd)
    app.add_typer(rollout_app, name="rollout")


def plan_cmd(
    args: Optional[List[str]] = TargetArgs,
    format: str = typer.Option("text", "--format", "-f", help="text (rich tables) or json."),
) -> None:
    """Show the rollout instances, their vLLM settings and a model-based estimate of one instance."""
    from specdraft.rollout.report.overview import plan_overview

    check_format(format)
    data = plan_overview(spec_from_args(args))
    if format == "json":
        import json

        from specdraft.plan.codec import encode_value

        sys.stdout.write(json.dumps(encode_value(data), indent=2) + "\n")
        return
    _print_plan(_console(), data)


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

    check_output(csv, "--csv", stdout_ok=True)
    spec = spec_from_args(args)
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
    table = new_table(title, ["anchor", "published", "model"])
    for row in calibration_rows(cost):
        table.add_row(*row)
    _console().print(table)
    if csv:
        _console().print(f"wrote {csv}", markup=False)


# ---- rendering (rich tables only; every number comes from specdraft.rollout) --------------------------------
def _print_plan(console, data: dict) -> None:
    from rich.markup import escape

    plan, typ = data["plan"], data["typical"]
    kv = plan.kv
    gib = 2**30
    settings = new_table("rollout settings", ["setting", "value"])
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
        ("speculation pays up to batch", f"{data['speculation_below_batch']} (the cost model)"),
        (
            "k by running batch",
            ", ".join(f"{a}-{b}: {k}" for a, b, k in plan.adaptive_k.schedule) + " (the cost model; the job "
            "re-derives it from measured acceptance)"
            if plan.adaptive_k
            else f"{plan.num_speculative_tokens} at every batch (rollout.adaptive_k: false)",
        ),
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
    inst = new_table("instances", ["instance", "node", "local GPUs", "training ranks"])
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


def _print_profile(console, name: str, rows: list[dict]) -> None:
    contexts = sorted({r["context"] for r in rows})
    for tp in sorted({r["tp"] for r in rows}):
        table = new_table(
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
