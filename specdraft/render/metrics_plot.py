"""`specdraft status --plot FILE.png`: a run's metrics.jsonl rows drawn over the steps: reward (a GRPO run) or the
losses (cotrain), accept length (the engine's and the training-time test's) and step time.

matplotlib is imported only here, lazily (the plot extra); the rows are untrusted and a value that is not a
number is left out of its line.
"""

from __future__ import annotations

import io
import math

from specdraft.errors import UserError


def check_plot_path(path: str) -> None:
    if not str(path).lower().endswith(".png"):
        raise UserError(f"--plot {path!r} must name a .png file", "e.g. --plot run.png")


def _value(row: dict, *keys: str) -> float:
    """row[k0][k1]... as a float, or nan when absent or not a finite number."""
    value: object = row
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return math.nan


def _series(rows: list[dict], *keys: str) -> tuple[list[int], list[float]]:
    """(1-based steps, values) of the rows whose value is a number."""
    pairs = [(r["step"] + 1, _value(r, *keys)) for r in rows if isinstance(r.get("step"), int)]
    kept = [(s, v) for s, v in pairs if not math.isnan(v)]
    return [s for s, _ in kept], [v for _, v in kept]


def plot_bytes(rows: list[dict], title: str) -> bytes:
    """A PNG of three panels over the steps; UserError without matplotlib or without a step to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib, which is not installed", "pip install 'specdraft[plot]'") from None
    if not any(isinstance(r.get("step"), int) for r in rows):
        raise UserError("--plot: the run has no step in metrics.jsonl yet", "plot it once it has run a step")
    grpo = any(r.get("phase") == "grpo" for r in rows)
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    top, middle, bottom = axes
    if grpo:
        scored = [r for r in rows if isinstance(r.get("step"), int) and not math.isnan(_value(r, "reward_mean"))]
        steps = [r["step"] + 1 for r in scored]
        mean = [_value(r, "reward_mean") for r in scored]
        std = [0.0 if math.isnan(_value(r, "reward_std")) else _value(r, "reward_std") for r in scored]
        top.plot(steps, mean, marker=".", label="reward: mean over the step's samples, ± std")
        top.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
        top.set_ylabel("reward")
    else:
        for key, label in (("target_loss", "target loss"), ("draft_loss", "draft loss")):
            top.plot(*_series(rows, key), marker=".", label=label)
        top.set_ylabel("loss")
    for keys, label in ((("engine", "accept_length"), "engine"), (("accept_len",), "training-time test")):
        steps, values = _series(rows, *keys)
        if values:
            middle.plot(steps, values, marker=".", label=label)
    middle.set_ylabel("accept length")
    bottom.plot(*_series(rows, "step_time_s"), marker=".", label="step")
    if grpo:
        for key, label in (("generate_s", "generate"), ("train_s", "train"), ("refit_s", "refit")):
            bottom.plot(*_series(rows, key), marker=".", label=label)
    bottom.set_ylabel("seconds")
    bottom.set_xlabel("step")
    for axis in axes:
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="best", fontsize="small")
    top.set_title(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()
