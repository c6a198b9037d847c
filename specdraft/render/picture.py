"""A picture of a plan: nodes x GPUs coloured by pipeline stage, draft ranks marked, TP and CP groups outlined,
TapChannel routes as arrows labelled with bytes per step; one tile per node beyond `DETAIL_LIMIT` ranks.

Pure (plan in, figure out). matplotlib is imported inside the functions, so the CLI starts without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdraft.plan.model import LaunchPlan

DETAIL_LIMIT = 64  # ranks drawn one cell each; larger plans get one tile per node
DPI = 100
CELL_IN = 1.1  # inches per GPU cell (detail) or per node tile (summary)
MARGIN_IN = (0.6, 1.2, 1.0, 0.4)  # left, top, bottom, right
MIN_WIDTH_IN = 9.0  # room for the title and the legend under a narrow grid
# One colour per pipeline stage (cycled beyond 20): a fixed palette, so the picture is the same everywhere.
STAGE_COLORS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#86bcb6",
    "#d4a6c8",
    "#8cd17d",
    "#f1ce63",
    "#a0cbe8",
    "#ffbe7d",
    "#499894",
    "#d37295",
    "#b6992d",
    "#79706e",
)
DRAFT_MARK = "#000000"
TP_EDGE = "#222222"
CP_EDGE = "#555555"
ARROW = "#202020"


def stage_color(stage: int) -> str:
    return STAGE_COLORS[stage % len(STAGE_COLORS)]


@dataclass(frozen=True)
class Picture:
    """A drawn plan: the matplotlib figure, its pixel size, and where each cell (rank or node) lies in pixels."""

    figure: object
    width_px: int
    height_px: int
    summary: bool  # one tile per node
    cells: dict  # rank (detail) or node (summary) -> (left, top, right, bottom) in image pixels, origin top left

    def fill_point(self, key: int) -> tuple[int, int]:
        """A pixel inside cell ``key`` that shows only its fill colour (clear of text, outlines and marks)."""
        left, top, right, bottom = self.cells[key]
        return int(left + 0.22 * (right - left)), int(top + 0.8 * (bottom - top))

    def mark_point(self, key: int) -> tuple[int, int]:
        """A pixel inside the draft mark of cell ``key`` (its top-right corner)."""
        left, top, right, bottom = self.cells[key]
        return int(right - 0.1 * (right - left)), int(top + 0.1 * (bottom - top))


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def draw(plan: LaunchPlan) -> Picture:
    """The picture of ``plan`` (detail up to DETAIL_LIMIT ranks, then one tile per node)."""
    if plan.world_size <= DETAIL_LIMIT:
        return _draw_ranks(plan)
    return _draw_nodes(plan)


def _figure(cols: int, rows: int):
    from matplotlib.figure import Figure

    left, top, bottom, right = MARGIN_IN
    width = max(cols * CELL_IN + left + right, MIN_WIDTH_IN)
    right = width - left - cols * CELL_IN
    height = rows * CELL_IN + top + bottom
    fig = Figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((left / width, bottom / height, cols * CELL_IN / width, rows * CELL_IN / height))
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)  # row 0 on top
    ax.set_axis_off()
    return fig, ax, round(width * DPI), round(height * DPI)


def _pixels(fig, ax, height_px: int, x0: float, y0: float, x1: float, y1: float) -> tuple[int, int, int, int]:
    """Data rectangle -> (left, top, right, bottom) image pixels (matplotlib's display origin is bottom left)."""
    (ax_, ay_), (bx_, by_) = ax.transData.transform([(x0, y0), (x1, y1)])
    return (
        round(min(ax_, bx_)),
        round(height_px - max(ay_, by_)),
        round(max(ax_, bx_)),
        round(height_px - min(ay_, by_)),
    )


def _draw_ranks(plan: LaunchPlan) -> Picture:
    from matplotlib.patches import Polygon, Rectangle

    gpn = plan.cluster.gpus_per_node
    nodes = -(-plan.world_size // gpn)
    fig, ax, width_px, height_px = _figure(gpn, nodes)
    draft = set(plan.draft.ranks)
    cells = {}
    for r in plan.ranks:
        x, y = r.local_rank, r.node
        ax.add_patch(Rectangle((x + 0.04, y + 0.04), 0.92, 0.92, facecolor=stage_color(r.pp), edgecolor="none"))
        ax.text(x + 0.5, y + 0.42, f"rank {r.global_rank}", ha="center", va="center", fontsize=8)
        ax.text(x + 0.5, y + 0.6, f"pp{r.pp} tp{r.tp} cp{r.cp} dp{r.dp}", ha="center", va="center", fontsize=6)
        if r.global_rank in draft:
            ax.add_patch(
                Polygon(
                    [(x + 0.68, y + 0.04), (x + 0.96, y + 0.04), (x + 0.96, y + 0.32)],
                    closed=True,
                    facecolor=DRAFT_MARK,
                    edgecolor="none",
                )
            )
        cells[r.global_rank] = (x, y)
    for group_key, style in (
        (("cp", "dp", "pp"), dict(edgecolor=TP_EDGE, linewidth=2.2, linestyle="-")),
        (("tp", "dp", "pp"), dict(edgecolor=CP_EDGE, linewidth=1.4, linestyle="--")),
    ):
        _outline_groups(ax, plan, group_key, Rectangle, style)
    _tap_arrows(ax, plan, cells.__getitem__)
    _legend(fig, plan, summary=False)
    fig.suptitle(
        f"{plan.name}: {plan.world_size} ranks on {nodes} node(s) x {gpn}, tp{plan.parallel.tp} "
        f"cp{plan.parallel.cp} pp{plan.parallel.pp} dp{plan.parallel.dp}",
        fontsize=11,
        y=0.99,
    )
    boxes = {
        rank: _pixels(fig, ax, height_px, x + 0.04, y + 0.04, x + 0.96, y + 0.96) for rank, (x, y) in cells.items()
    }
    return Picture(figure=fig, width_px=width_px, height_px=height_px, summary=False, cells=boxes)


def _outline_groups(ax, plan: LaunchPlan, fixed: tuple[str, ...], Rectangle, style: dict) -> None:
    """Outline each group (the ranks sharing the ``fixed`` coordinates) by the box around its cells."""
    groups: dict[tuple, list] = {}
    for r in plan.ranks:
        groups.setdefault(tuple(getattr(r, k) for k in fixed), []).append(r)
    for members in groups.values():
        if len(members) < 2:
            continue
        x0, x1 = min(r.local_rank for r in members), max(r.local_rank for r in members)
        y0, y1 = min(r.node for r in members), max(r.node for r in members)
        ax.add_patch(Rectangle((x0 + 0.02, y0 + 0.02), x1 - x0 + 0.96, y1 - y0 + 0.96, facecolor="none", **style))


def _tap_arrows(ax, plan: LaunchPlan, cell_of) -> None:
    """One arrow per source stage to the draft's stage (from the lowest source rank to its draft rank), labelled
    with the taps it carries and their bytes per step over all their routes."""
    by_stage: dict[int, list] = {}
    for tap in plan.taps:
        if not tap.local:
            by_stage.setdefault(tap.src_stage, []).append(tap)
    for i, (_stage, taps) in enumerate(sorted(by_stage.items())):
        names = {tap.tap for tap in taps}
        route = min((rt for rt in plan.tap_routes if rt.tap in names), key=lambda rt: rt.src_rank)
        (sx, sy), (dx, dy) = cell_of(route.src_rank), cell_of(route.dst_rank)
        total = sum(tap.bytes_per_step for tap in taps)
        routes = sum(tap.num_routes for tap in taps)
        label = f"taps {', '.join(str(t.tap) for t in taps)}: {_bytes(total)}/step ({routes} routes)"
        _arrow(ax, (sx + 0.5, sy + 0.5), (dx + 0.5, dy + 0.5), label, bend=0.25 + 0.1 * i)


def _arrow(ax, start, end, label: str, bend: float) -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=14,
            color=ARROW,
            linewidth=1.4,
            connectionstyle=f"arc3,rad={bend}",
            zorder=5,
        )
    )
    # The label sits a quarter of the way along, beside the source, so labels of different sources do not meet.
    lx, ly = start[0] + 0.25 * (end[0] - start[0]) + 0.2, start[1] + 0.25 * (end[1] - start[1])
    ax.text(
        lx,
        ly,
        label,
        fontsize=7,
        ha="left",
        va="center",
        zorder=6,
        bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor=ARROW, linewidth=0.6, alpha=0.9),
    )


def _legend(fig, plan: LaunchPlan, summary: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=stage_color(s.pp), label=f"stage {s.pp}") for s in plan.stages[:20]]
    if plan.draft.enabled:
        handles.append(Patch(facecolor=DRAFT_MARK, label=f"draft (stage {plan.draft.stage})"))
    if not summary:
        handles.append(Line2D([], [], color=TP_EDGE, linewidth=2.2, label="TP group"))
        handles.append(Line2D([], [], color=CP_EDGE, linewidth=1.4, linestyle="--", label="CP group"))
    handles.append(Line2D([], [], color=ARROW, marker=">", label="TapChannel route"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)


def _draw_nodes(plan: LaunchPlan) -> Picture:
    from matplotlib.patches import Polygon, Rectangle

    gpn = plan.cluster.gpus_per_node
    nodes = -(-plan.world_size // gpn)
    cols = min(nodes, max(8, math.ceil(math.sqrt(nodes))))
    rows = -(-nodes // cols)
    fig, ax, width_px, height_px = _figure(cols, rows)
    stages: dict[int, list[int]] = {}
    for r in plan.ranks:
        stages.setdefault(r.node, [])
        if r.pp not in stages[r.node]:
            stages[r.node].append(r.pp)
    draft_nodes = {plan.ranks[r].node for r in plan.draft.ranks}
    cells = {}
    for node in range(nodes):
        x, y = node % cols, node // cols
        held = sorted(stages.get(node, []))
        width = 0.92 / max(len(held), 1)
        for i, stage in enumerate(held):  # a node holding several stages is striped
            ax.add_patch(
                Rectangle((x + 0.04 + i * width, y + 0.04), width, 0.92, facecolor=stage_color(stage), edgecolor="none")
            )
        if node in draft_nodes:
            ax.add_patch(
                Polygon(
                    [(x + 0.68, y + 0.04), (x + 0.96, y + 0.04), (x + 0.96, y + 0.32)],
                    closed=True,
                    facecolor=DRAFT_MARK,
                    edgecolor="none",
                )
            )
        if cols <= 16:
            ax.text(
                x + 0.5, y + 0.5, f"node {node}\npp " + ",".join(map(str, held)), ha="center", va="center", fontsize=7
            )
        cells[node] = (x, y)
    _tap_arrows(ax, plan, lambda rank: cells[plan.ranks[rank].node])
    _legend(fig, plan, summary=True)
    fig.suptitle(
        f"{plan.name}: {plan.world_size} ranks, one tile per node ({nodes} nodes x {gpn}), "
        f"tp{plan.parallel.tp} cp{plan.parallel.cp} pp{plan.parallel.pp} dp{plan.parallel.dp}",
        fontsize=11,
        y=0.99,
    )
    boxes = {
        node: _pixels(fig, ax, height_px, x + 0.04, y + 0.04, x + 0.96, y + 0.96) for node, (x, y) in cells.items()
    }
    return Picture(figure=fig, width_px=width_px, height_px=height_px, summary=True, cells=boxes)


def picture_bytes(plan: LaunchPlan, fmt: str) -> bytes:
    """The picture of ``plan`` as PNG or SVG bytes (``fmt`` "png" or "svg")."""
    import io

    buffer = io.BytesIO()
    draw(plan).figure.savefig(
        buffer, format=fmt, dpi=DPI, metadata={"Software": None} if fmt == "png" else {"Date": None}
    )
    return buffer.getvalue()
