"""`--plot` / `--plot-tp`: PNG timelines of instance utilisation, trainer queue depth, and static vs adaptive TP.

matplotlib is imported only here, lazily, so the rest of specdraft.rollout stays stdlib-only.
"""

from __future__ import annotations

import math

from specdraft.errors import UserError


def _resample(times: list[float], values: list[float], grid: list[float]) -> list[float]:
    """Step-hold ``values`` (value i holds from times[i] to times[i+1]) onto ``grid``."""
    out, j = [], 0
    for t in grid:
        while j + 1 < len(times) and times[j + 1] <= t:
            j += 1
        out.append(values[j] if times else math.nan)
    return out


def _grid(end: float, points: int = 1200) -> list[float]:
    return [end * i / (points - 1) for i in range(points)]


def _pyplot(path: str):
    """matplotlib's pyplot (Agg) and ListedColormap, or a UserError naming what is missing or wrong."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
    except ImportError:
        raise UserError("--plot needs matplotlib", "pip install 'specdraft[plot]' (or matplotlib)") from None
    if not str(path).lower().endswith(".png"):
        raise UserError(f"{path!r} must name a .png file", "e.g. --plot rollout-timeline.png")
    return plt, ListedColormap


def _save(fig, plt, path: str) -> None:
    import io

    from specdraft.fsutil import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def write_timeline(path: str, report) -> None:
    """Draw the asp run of seed 0 (and the adaptive-TP generation of seed 0) into ``path``."""
    plt, ListedColormap = _pyplot(path)
    tl = report.timeline
    gen = report.generation_timeline
    rows = 2 + (1 if gen else 0)
    fig, axes = plt.subplots(
        rows,
        1,
        figsize=(12, 3.1 * rows + 0.6),
        constrained_layout=True,
        gridspec_kw={"height_ratios": [3, 1.4] + ([3] if gen else [])},
    )
    data = report.data
    fig.suptitle(
        f"{data['layout']}: asp schedule, seed 0 ({data['instances']} instances x tp {data['tp']}, "
        f"{'colocated' if data['colocated'] else 'dedicated rollout'}) - model-based",
        fontsize=12,
    )
    if tl and tl["t"]:
        times = tl["t"]
        grid = _grid(times[-1])
        util = [_resample(times, col, grid) for col in tl["util"]]
        peak = max([v for row in util for v in row] + [1.0])
        cmap = plt.get_cmap("viridis").copy()
        cmap.set_bad("#d9d9d9")
        masked = [[math.nan if v < 0 else v / peak for v in row] for row in util]
        ax = axes[0]
        im = ax.imshow(
            masked,
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            vmin=0,
            vmax=1,
            extent=(0, times[-1], len(util) - 0.5, -0.5),
        )
        ax.set_ylabel("rollout instance")
        ax.set_yticks(range(len(util)))
        ax.set_title(
            f"utilisation: running sequences / {peak:.0f} (the fullest batch seen); grey: GPUs lent to "
            "training, dark: idle",
            fontsize=10,
        )
        fig.colorbar(im, ax=ax, pad=0.01, label="batch fill")
        ax2 = axes[1]
        ax2.step(times, tl["queue"], where="post", color="#d62728", lw=1.2, label="minibatches ready, not trained")
        ax2.set_ylabel("trainer queue")
        ax2.set_xlim(0, times[-1])
        ax2.set_xlabel("time (s)")
        twin = ax2.twinx()
        twin.step(times, tl["version"], where="post", color="#1f77b4", lw=1.0, alpha=0.7, label="policy version")
        twin.set_ylabel("policy version")
        lines = ax2.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        labels = ax2.get_legend_handles_labels()[1] + twin.get_legend_handles_labels()[1]
        ax2.legend(lines, labels, loc="upper left", fontsize=8)
    if gen:
        _generation_panel(axes[2], gen, report.switches, plt, ListedColormap)
    _save(fig, plt, path)


def _running(timeline: list) -> tuple[list[float], list[float]]:
    """(times, running sequences on the node) from a generation timeline (each GPU repeats its group's batch)."""
    return [t for t, _ in timeline], [sum(batch / tp for tp, batch, _ in snap) for _, snap in timeline]


def write_tp_timeline(path: str, report) -> None:
    """Seed 0's generation step: the adaptive run's groups per GPU with its switch points, and the running
    sequences over time of every static TP and of adaptive TP, each ending at its makespan."""
    plt, ListedColormap = _pyplot(path)
    gen = report.generation_timeline
    if not gen:
        raise UserError("--plot-tp has no adaptive run to draw", "add --adaptive-tp")
    data = report.data
    fig, axes = plt.subplots(
        2, 1, figsize=(12, 7.4), constrained_layout=True, gridspec_kw={"height_ratios": [3, 2.2]}, sharex=True
    )
    fig.suptitle(f"{data['layout']}: one generation step, seed 0 - static TP vs adaptive TP (model-based)", fontsize=12)
    _generation_panel(axes[0], gen, report.switches, plt, ListedColormap)
    axes[0].set_xlabel("")
    ax = axes[1]
    palette = {1: "#9ecae1", 2: "#6baed6", 4: "#3182bd", 8: "#08519c"}
    for tp, timeline in sorted(report.static_timelines.items()):
        times, running = _running(timeline)
        ax.step(
            times,
            running,
            where="post",
            lw=1.1,
            color=palette.get(tp, "#777777"),
            label=f"static tp {tp}: {times[-1]:.0f} s",
        )
    times, running = _running(gen)
    start = data.get("generation", {}).get("adaptive", {}).get("start_tp", "?")
    ax.step(times, running, where="post", lw=2.2, color="#d62728", label=f"adaptive from tp {start}: {times[-1]:.0f} s")
    for sw in report.switches:
        ax.axvline(sw["time_s"], color="#d62728", lw=0.8, ls="--", alpha=0.6)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("running sequences (node)")
    ax.set_xlabel("time (s)")
    ax.set_title(
        "running sequences over time; each line ends at its makespan, dashed: adaptive switch points", fontsize=10
    )
    ax.legend(loc="upper right", fontsize=8)
    _save(fig, plt, path)


def _generation_panel(ax, gen, switches, plt, ListedColormap) -> None:
    times = [t for t, _ in gen]
    gpus = len(gen[0][1])
    end = times[-1] if times[-1] > 0 else 1.0
    grid = _grid(end)
    # Colour = the GPU's group TP; GPUs whose group runs nothing are drawn pale.
    tp_rows, idle_rows = [], []
    for g in range(gpus):
        tps = [snap[g][0] for _, snap in gen]
        busy = [1.0 if snap[g][1] > 0 else 0.0 for _, snap in gen]
        tp_rows.append(_resample(times, [math.log2(t) for t in tps], grid))
        idle_rows.append(_resample(times, busy, grid))
    levels = ListedColormap(["#9ecae1", "#4292c6", "#2171b5", "#08306b"])
    shown = [[tp if busy else math.nan for tp, busy in zip(tr, br)] for tr, br in zip(tp_rows, idle_rows)]
    cmap = levels.copy()
    cmap.set_bad("#f0f0f0")
    im = ax.imshow(
        shown, aspect="auto", interpolation="nearest", cmap=cmap, vmin=-0.5, vmax=3.5, extent=(0, end, gpus - 0.5, -0.5)
    )
    bar = plt.colorbar(im, ax=ax, pad=0.01, ticks=[0, 1, 2, 3])
    bar.ax.set_yticklabels(["tp1", "tp2", "tp4", "tp8"])
    for sw in switches:
        ax.axvline(sw["time_s"], color="#d62728", lw=1.2, ls="--")
        first = sw["to"]["gpus"][0]
        ax.annotate(
            f"tp{sw['from'][0]['tp']} -> tp{sw['to']['tp']}",
            (sw["time_s"], first),
            xytext=(4, 0),
            textcoords="offset points",
            color="white",
            fontsize=8,
            va="center",
            bbox={"boxstyle": "round,pad=0.2", "fc": "#d62728", "ec": "none"},
        )
    ax.set_ylabel("GPU")
    ax.set_yticks(range(gpus))
    ax.set_xlabel("time (s)")
    ax.set_title(
        "adaptive TP, generation of one step (seed 0): group TP per GPU, switch points dashed "
        "(pale: GPU's group has finished)",
        fontsize=10,
    )
