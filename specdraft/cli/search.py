"""`specdraft search`: the best layouts of a spec's model, cluster and batch (thin; the logic is specdraft.search)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from specdraft.cli.args import target_args
from specdraft.cli.boundary import console as _console

TargetArgs = target_args("the built-in tiny CPU layout")
GIB = 2**30
# The estimate's breakdown terms, in the order it sums them, with their short names in the text table.
COLUMNS = (
    ("compute_s", "compute"),
    ("tp_sp_comm_s", "tp/sp"),
    ("cp_ring_s", "cp ring"),
    ("ep_a2a_s", "ep a2a"),
    ("pp_p2p_s", "p2p"),
    ("pp_bubble_s", "bubble"),
    ("dp_comm_s", "dp"),
    ("optimizer_s", "optimizer"),
    ("tapchannel_s", "taps"),
    ("draft_s", "draft"),
)


def register(app) -> None:
    app.command("search")(search_cmd)


def parse_pins(pins: list[str] | None) -> tuple[list[str], frozenset[str]]:
    """`--pin FIELD=VALUE` arguments -> (overrides that set them, the pinned field paths); unknown fields refused."""
    import difflib

    from specdraft.errors import UserError
    from specdraft.search.space import SEARCHED

    overrides, fields = [], set()
    for pin in pins or []:
        field, sep, value = pin.partition("=")
        if not sep or not field or not value:
            raise UserError(f"--pin {pin!r} is not FIELD=VALUE", "e.g. --pin parallel.tp=8")
        if field not in SEARCHED:
            close = difflib.get_close_matches(field, SEARCHED, n=2)
            hint = f"did you mean {' or '.join(close)}?" if close else f"pin one of: {', '.join(SEARCHED)}"
            raise UserError(
                f"--pin {field}: not a field the search varies (model, cluster, batch and dtype come "
                "from the spec and its overrides)",
                hint,
            )
        overrides.append(pin)
        fields.add(field)
    return overrides, frozenset(fields)


def search_cmd(
    args: Optional[List[str]] = TargetArgs,
    top: int = typer.Option(10, "--top", "-k", help="How many layouts to show, best first."),
    format: str = typer.Option("text", "--format", "-f", help="text (rich table) or json."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the best layout as YAML (atomically)."),
    pin: Optional[List[str]] = typer.Option(
        None, "--pin", metavar="FIELD=VALUE", help="Keep a searched field fixed (repeatable), e.g. parallel.tp=8."
    ),
) -> None:
    """Rank every valid layout of the spec's model and cluster by estimated step time (the draft included)."""
    from specdraft.cli.args import note_model_folder, split_target
    from specdraft.errors import SpecError, UserError
    from specdraft.search.output import layout_yaml, result_json
    from specdraft.search.ranking import search
    from specdraft.spec.bounds import check as check_bounds
    from specdraft.spec.load import load_layout

    if format not in ("text", "json"):
        raise UserError(f"--format {format!r} is not supported", "use --format text or --format json")
    if top < 1:
        raise UserError(f"--top {top} must be >= 1", "e.g. --top 10")
    path, overrides = split_target(args)
    pin_overrides, pins = parse_pins(pin)
    spec = load_layout(path, [*overrides, *pin_overrides])
    note_model_folder(spec.model.path)
    out_of_bounds = check_bounds(spec)
    if out_of_bounds:  # the message `validate` gives, not "no valid layout ... add nodes"
        raise SpecError(out_of_bounds, path or "the built-in default layout")
    result = search(spec, top_k=top, pins=pins)
    if not result.rows:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(result.rejections.items())) or "none verified"
        raise UserError(
            f"no valid layout of {spec.name} on {spec.cluster.num_nodes} x {spec.cluster.gpus_per_node} "
            f"{spec.cluster.gpu} ({result.num_candidates:,} candidates, {result.num_pruned:,} over the "
            f"memory bound, rejected: {reasons})",
            "add nodes, shorten model.seq_length, lower training.global_batch_size, or drop --pin",
        )
    if output:
        from specdraft.fsutil import atomic_write_text

        atomic_write_text(output, layout_yaml(result.rows[0]), what="layout")
    if format == "json":
        import json

        sys.stdout.write(json.dumps(result_json(result), indent=2) + "\n")
        return
    _print_result(_console(), spec, result)
    if output:
        _console().print(f"wrote {output} (the best layout; `specdraft plan {output}` compiles it)")


def _print_result(console, spec, result) -> None:
    from rich.table import Table

    rows = result.rows
    shown = [(key, name) for key, name in COLUMNS if any(r.estimate.breakdown[key] > 0 for r in rows)]
    table = Table(
        title=f"{spec.name}: {spec.cluster.num_nodes} x {spec.cluster.gpus_per_node} {spec.cluster.gpu}, "
        f"seq {spec.model.seq_length}, global batch {spec.training.global_batch_size}, "
        f"{spec.training.dtype}; estimates"
    )
    for col in ("#", "layout", "split", "mbs", "recompute", "draft", "step s", "tok/s/GPU", "MFU", "peak GiB"):
        table.add_column(col, justify="right" if col not in ("layout", "split", "recompute") else "left")
    table.add_column("where the step goes (s)", justify="left")
    for i, row in enumerate(rows, 1):
        lay, est = row.layout, row.estimate
        d = lay.dims
        layout = (
            f"tp{d.tp} cp{d.cp} pp{d.pp}"
            + (f" vpp{lay.vpp}" if lay.vpp > 1 else "")
            + f" dp{d.dp}"
            + (f" ep{d.ep} etp{d.etp}" if spec.model.num_experts else "")
            + (" sp" if d.sequence_parallel else "")
        )
        parts = ", ".join(f"{name} {est.breakdown[key]:.3g}" for key, name in shown if est.breakdown[key] > 0)
        table.add_row(
            str(i),
            layout,
            _split(d),
            str(d.micro_batch_size),
            lay.recompute,
            "-" if lay.draft_stage is None else str(lay.draft_stage),
            f"{est.step_time_s:.3f}",
            f"{est.tokens_per_s_per_gpu:,.0f}",
            f"{est.mfu:.1%}",
            f"{row.peak_memory_bytes / GIB:.1f}",
            parts,
        )
    console.print(table)
    rejected = ", ".join(f"{n} {why}" for why, n in sorted(result.rejections.items()))
    console.print(
        f"{result.num_candidates:,} candidate layouts: {result.num_pruned:,} over the memory lower bound, "
        f"{result.num_estimated:,} estimated (the rest bounded out), {result.num_verified} verified by "
        f"the full validation{f' ({rejected} rejected)' if rejected else ''}; {result.seconds:.2f} s"
    )


def _split(p) -> str:
    """A compact name for the layer split: even, first/last stage layers, or e/l for the accounted embedding/loss."""
    parts = []
    if p.first_stage_layers is not None:
        parts.append(f"first {p.first_stage_layers}")
    if p.last_stage_layers is not None:
        parts.append(f"last {p.last_stage_layers}")
    if p.account_for_embedding_in_pipeline_split:
        parts.append("+emb")
    if p.account_for_loss_in_pipeline_split:
        parts.append("+loss")
    return " ".join(parts) or "even"
