"""The `specdraft` command: thin typer commands; every error goes through cli.boundary."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from specdraft import __version__
from specdraft.cli.args import target_args, typer_app
from specdraft.cli.boundary import console as _console

app = typer_app(
    "specdraft", "Plan, validate and launch RL post-training with an online co-trained EAGLE-3 draft under TP/CP/PP."
)

TargetArgs = target_args("the built-in tiny CPU layout")


@app.command()
def plan(
    args: Optional[List[str]] = TargetArgs,
    format: str = typer.Option("text", "--format", "-f", help="text (rich summary) or json."),
    output: Optional[str] = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the JSON plan to this file (atomically; a regular file only), or to standard output with `-o -`.",
    ),
    balance: bool = typer.Option(False, "--balance", help="Apply the uneven split that evens peak memory."),
    picture: Optional[str] = typer.Option(
        None,
        "--picture",
        metavar="FILE.png|FILE.svg",
        help="Draw nodes x GPUs by stage, draft ranks, TP/CP groups and tap routes (needs matplotlib: the plot extra).",
    ),
) -> None:
    """Compile a layout into a launch plan and show it."""
    from specdraft.cli.args import load_plan
    from specdraft.errors import UserError
    from specdraft.fsutil import STDOUT, check_output_path, write_output

    if format not in ("text", "json"):
        raise UserError(f"--format {format!r} is not supported", "use --format text or --format json")
    if picture and not picture.lower().endswith((".png", ".svg")):
        raise UserError(f"--picture {picture!r} must name a .png or .svg file", "e.g. --picture plan.png")
    for path, what in ((output, "plan"), (picture, "picture")):
        if path is not None and path != STDOUT:
            check_output_path(path, what)  # refuse a FIFO, link or device before compiling, not after
    launch_plan, suggestion = load_plan(args, balance=balance)
    if picture:
        _write_picture(launch_plan, picture)
    if output is not None:
        write_output(output, launch_plan.to_json(), "plan")
    if output == STDOUT:
        return  # the JSON is the output; a summary next to it would corrupt it
    if format == "json":
        if output is None:
            sys.stdout.write(launch_plan.to_json())
        return
    from specdraft.cli.show import print_plan

    print_plan(_console(), launch_plan, None if balance else suggestion)
    for path in (output, picture):
        if path:
            _console().print(f"wrote {path}", markup=False)


def _write_picture(launch_plan, path: str) -> None:
    from specdraft.errors import UserError
    from specdraft.fsutil import atomic_write_bytes

    try:
        import matplotlib  # noqa: F401 - only to learn whether the plot extra is installed
    except ImportError:
        raise UserError("--picture needs matplotlib, which is not installed", "pip install 'specdraft[plot]'") from None
    from specdraft.render.picture import picture_bytes

    atomic_write_bytes(path, picture_bytes(launch_plan, path.lower().rsplit(".", 1)[1]), what="picture")


@app.command()
def validate(
    args: Optional[List[str]] = TargetArgs,
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="Also ask the Slurm cluster (bounded sinfo/scontrol) "
        "whether it could ever run the job: partition, nodes, CPUs, GPUs, memory, time.",
    ),
) -> None:
    """Dry-run a layout: report every problem at once (exit 2), or confirm it is valid (exit 0)."""
    from specdraft.assemble import check
    from specdraft.cli.args import note_model_folder, split_target
    from specdraft.cli.show import print_warnings
    from specdraft.errors import SpecError
    from specdraft.spec.load import load_layout

    path, overrides = split_target(args)
    spec = load_layout(path, overrides)
    note_model_folder(spec.model.path)
    errors, warnings = check(spec)
    from specdraft.spec.validate.grpo import reward_problem

    missing = reward_problem(spec.grpo.reward)  # user code is looked up, never imported: validate runs none of it
    errors = errors + ([missing] if missing else [])
    if not errors:
        from specdraft.assemble import compile
        from specdraft.render.nemo_rl import refusals

        warnings = warnings + refusals(compile(spec), severity="warning")  # what `render --to nemo-rl` refuses
    console = _console()
    print_warnings(console, warnings)
    if errors:
        raise SpecError(errors, path or "the built-in default layout")
    if spec.data.path is not None:
        from specdraft.datafile import check_file

        fmt, rows = check_file(spec.data.path, spec.data.format, spec.model.path)
        console.print(
            f"data: {spec.data.path}: "
            + (
                f"{rows:,} rows of {fmt}"
                if rows is not None
                else "parquet (pyarrow is not installed here: the ranks check its rows)"
            )
        )
    console.print(
        f"[green]valid:[/] {spec.name} ({spec.cluster.num_nodes * spec.cluster.gpus_per_node} GPUs, "
        f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''})"
    )
    if cluster:
        from specdraft.execute.slurm.preflight import describe, require

        part = require(spec, lambda message: console.print(f"warning: {message}", markup=False), strict=True)
        console.print(f"[green]the cluster can run it:[/] {describe(spec, part)}")


@app.command()
def explain(
    field: Optional[str] = typer.Argument(None, help="A field path such as parallel.cp, or a section."),
) -> None:
    """Print a layout field's documentation, type and default (every field without FIELD)."""
    from rich.markup import escape

    from specdraft.spec.docs import all_fields
    from specdraft.spec.docs import explain as explain_field
    from specdraft.spec.gpus import describe

    console = _console()
    docs = explain_field(field) if field else all_fields()
    for doc in docs:
        if doc.section:
            console.print(f"[bold]{doc.path}[/]  {escape(doc.doc)}")
            continue
        console.print(f"[bold cyan]{doc.path}[/]  ({escape(doc.type)}, default {escape(doc.default)})")
        console.print(f"    {escape(doc.doc)}")
        if doc.path == "cluster.gpu":
            console.print("    " + escape(describe()).replace("\n", "\n    "))


@app.command()
def render(
    args: Optional[List[str]] = typer.Argument(None, metavar="PLAN|LAYOUT [OVERRIDES...]"),
    to: str = typer.Option(..., "--to", help="megatron, nemo-rl or vllm."),
    check: bool = typer.Option(
        False, "--check", help="vllm: let vLLM validate the settings (exit 2 when it refuses or is not installed)."
    ),
) -> None:
    """Render a plan for Megatron-LM (argv), NeMo-RL (YAML overrides) or vLLM (engine settings)."""
    from specdraft.cli.args import load_plan
    from specdraft.errors import UserError

    launch_plan, _ = load_plan(args)
    renders = launch_plan.renders
    if to == "megatron":
        from specdraft.render.megatron import megatron_text
        from specdraft.spec.checkpoints.hf_config import no_tokenizer

        sys.stdout.write(megatron_text(launch_plan, no_tokenizer(launch_plan.model.path)))
    elif to == "nemo-rl":
        from specdraft.errors import SpecError
        from specdraft.render.nemo_rl import PROFILE, refusals, render_text

        refused = refusals(launch_plan)
        if refused:
            raise SpecError(refused, f"the NeMo-RL render of {launch_plan.name} (profile {PROFILE})")
        sys.stdout.write(render_text(launch_plan))
        _placeholder_notes(launch_plan)
    elif to == "vllm":
        import json

        vllm = renders.vllm
        if vllm.problems:
            raise UserError(
                "the vLLM settings break vLLM's rules: " + "; ".join(vllm.problems),
                "fix the rollout section of the layout",
            )
        sys.stdout.write(json.dumps(vllm.engine_args, indent=2) + "\n")
        _placeholder_notes(launch_plan)
        if check:
            from specdraft.execute.vllm_check import check_with_vllm

            _console(stderr=True).print(check_with_vllm(vllm.engine_args), markup=False)
    else:
        raise UserError(f"--to {to!r} is not a render target", "use --to megatron, --to nemo-rl or --to vllm")


def _placeholder_notes(plan) -> None:
    """On stderr: the values of a render that are named placeholders, and what to set instead."""
    from specdraft.render.paths import placeholder_notes

    for note in placeholder_notes(plan, plan.draft.enabled and plan.rollout_settings.speculative):
        _console(stderr=True).print(f"note: {note}", markup=False)


@app.command()
def version() -> None:
    """Print the specdraft version."""
    print(__version__)


def _print_version(value: bool) -> None:
    if value:
        print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the specdraft version and exit."
    ),
) -> None:
    """Plan, validate and launch RL post-training with an online co-trained EAGLE-3 draft under TP/CP/PP."""


def _register_optional_commands() -> None:
    """Launch/run-management, rollout, search and export commands live in their own modules (imported lazily
    inside); `rollout measure` joins the rollout sub-app."""
    from specdraft.cli import export as export_cmds
    from specdraft.cli import launch as launch_cmds
    from specdraft.cli import measure as measure_cmds
    from specdraft.cli import rollout as rollout_cmds
    from specdraft.cli import rollouts_view
    from specdraft.cli import search as search_cmds

    launch_cmds.register(app)
    rollouts_view.register(app)
    rollout_cmds.register(app)
    measure_cmds.register(rollout_cmds.rollout_app)
    search_cmds.register(app)
    export_cmds.register(app)


def main() -> None:
    from specdraft.cli.boundary import run

    _register_optional_commands()
    sys.exit(run(lambda: app(standalone_mode=False)))
