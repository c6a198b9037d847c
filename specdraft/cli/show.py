"""Rich rendering of a plan for the terminal: layout, stages and memory, taps, draft, Megatron args, warnings."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

GIB = 2**30


def _bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def print_plan(console: Console, plan, suggestion) -> None:
    par = plan.parallel
    cluster = plan.cluster
    layout = Table(title=f"layout {plan.name}  (spec sha256 {plan.spec_sha256[:12]})", show_header=True)
    for col in (
        "world",
        "nodes x gpus",
        "gpu",
        "tp",
        "cp",
        "pp",
        "dp",
        "ep",
        "etp",
        "vpp",
        "sp",
        "order",
        "microbatches",
    ):
        layout.add_column(col)
    layout.add_row(
        str(plan.world_size),
        f"{cluster.num_nodes} x {cluster.gpus_per_node}",
        cluster.gpu,
        *(str(v) for v in (par.tp, par.cp, par.pp, par.dp, par.ep, par.etp)),
        str(par.vpp or "-"),
        "yes" if par.sequence_parallel else "no",
        par.order,
        str(plan.num_microbatches),
    )
    console.print(layout)

    stages = Table(title="pipeline stages: layers and memory per GPU")
    for col in ("stage", "layers", "weights", "grads", "optimizer", "activations", "draft", "total", "of HBM"):
        stages.add_column(col, justify="right")
    for st, mem in zip(plan.stages, plan.memory):
        if len(st.chunks) > 1:
            layers = " ".join(f"v{c.vpp}:{c.first_layer}-{c.last_layer}" for c in st.chunks)
        else:
            layers = f"{st.first_layer}-{st.last_layer} ({st.num_layers})"
        frac = mem.fraction
        style = "red" if frac > 1 else "yellow" if frac > 0.9 else ""
        stages.add_row(
            str(st.pp),
            layers,
            *(_bytes(v) for v in (mem.weights, mem.grads, mem.optimizer, mem.activations, mem.draft, mem.total)),
            f"[{style}]{frac:.1%}[/]" if style else f"{frac:.1%}",
        )
    console.print(stages)

    draft = plan.draft
    if draft.enabled:
        console.print(
            f"[bold]draft[/] EAGLE-3 on stage {draft.stage} (ranks {_ranges(list(draft.ranks))}), "
            f"aux layers {list(draft.aux_layers)}, ttt_steps {plan.draft.ttt_steps}, "
            f"CP attention [bold]{draft.cp_attention}[/], {draft.num_params:,} params, "
            f"{_bytes(draft.memory_bytes)} per GPU, {draft.landing_slots} landing slot(s)"
        )
        if draft.padding:
            pad = draft.padding
            console.print(
                f"  packing: pad each sequence to a multiple of {pad.pad_multiple}; padding overhead "
                f"{pad.padding_overhead:.2%} for lengths {list(pad.sequence_lengths[:8])}"
                f"{' ...' if len(pad.sequence_lengths) > 8 else ''}"
            )
        taps = Table(title="TapChannel routes (per tap)")
        for col in ("tap", "source stage", "dest stage", "routes", "bytes/step", "cross-node"):
            taps.add_column(col, justify="right")
        for tap in plan.taps:
            src = f"{tap.src_stage}" + (f" (v{tap.src_chunk})" if par.vpp else "")
            taps.add_row(
                str(tap.tap),
                src,
                str(tap.dst_stage),
                "local" if tap.local else str(tap.num_routes),
                "-" if tap.local else _bytes(tap.bytes_per_step),
                str(tap.num_cross_node),
            )
        console.print(taps)
        traffic = plan.tap_traffic
        console.print(
            f"  tap transport {_bytes(traffic.bytes_per_step)}/step "
            f"({_bytes(traffic.cross_node_bytes_per_step)} cross-node) vs pipeline P2P "
            f"{_bytes(traffic.pipeline_activation_bytes_per_step)}/step"
        )
    else:
        console.print("[bold]draft[/] disabled")
    if suggestion:
        console.print(
            f"[yellow]balance:[/] the draft's stage is the heaviest; {suggestion.override} lowers the "
            f"peak from {_bytes(suggestion.peak_before)} to {_bytes(suggestion.peak_after)} "
            f"(apply it with `specdraft plan --balance`)"
        )
    if plan.rollout is not None:
        r = plan.rollout
        console.print(
            f"[bold]rollout[/] {r.num_instances} vLLM instance(s) at TP {r.tp} on {r.num_gpus} "
            f"GPU(s){' (colocated)' if r.colocated else ''}, speculative={r.speculative}"
        )
    console.print("[bold]megatron args[/]")
    console.print(shlex.join(plan.renders.megatron), soft_wrap=True, highlight=False, markup=False)
    print_warnings(console, plan.warnings)


def print_warnings(console: Console, warnings) -> None:
    """Warnings of a plan (PlanWarning) or of validation (Problem): both carry path, value, rule and fix."""
    from rich.markup import escape

    for w in warnings:
        console.print(
            f"[yellow]warning:[/] {escape(w.path)} = {escape(repr(w.value))}: {escape(w.rule)}; {escape(w.fix)}"
        )


def _ranges(ranks: list[int]) -> str:
    if not ranks:
        return "-"
    out, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)
