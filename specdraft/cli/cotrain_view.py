"""Co-training in the terminal: a rich progress bar fed by metrics.jsonl, and the final acceptance table."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdraft.cli.terminal import plain
from specdraft.errors import UserError
from specdraft.execute.monitor import read_metrics

_ROW_NUMBERS = ("step", "target_loss", "draft_loss", "accept_len", "tap_bytes")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _acceptance_rows(rows: list[dict]) -> list[dict]:
    """The metrics.jsonl rows of co-training steps with an acceptance list; rows of another shape are not shown."""
    return [
        r
        for r in rows
        if isinstance(r.get("acceptance"), list)
        and r["acceptance"]
        and all(map(_is_number, r["acceptance"]))
        and all(_is_number(r.get(k)) for k in _ROW_NUMBERS)
    ]


class ProgressBar:
    """Steps done out of the run's total, with the latest losses and acceptance, redrawn as metrics arrive."""

    def __init__(self, console: Console, folder: str | Path, total_steps: int, label: str = "cotrain"):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.folder = folder
        self.progress = Progress(
            TextColumn("co-training" if label == "cotrain" else label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}", markup=False),  # metrics.jsonl's words are no markup
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("steps", total=total_steps, info="starting ranks")

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.update()
        self.progress.stop()

    def update(self) -> None:
        try:
            rows = read_metrics(self.folder)
        except UserError as err:  # a display only: a refused metrics.jsonl must not stop the run it shows
            self.progress.update(self.task, info=f"metrics.jsonl unreadable: {plain(err.message, one_line=True)[:80]}")
            return
        if not rows:
            return
        last = rows[-1]
        if last.get("phase") == "grpo":
            self.progress.update(self.task, completed=len(rows), info=grpo_info(last))
            return
        if not _is_number(last.get("target_loss")):
            self.progress.update(self.task, completed=len(rows))
            return
        info = f"target {last['target_loss']:.3f}"
        if _acceptance_rows([last]):
            info += f"  draft {last['draft_loss']:.3f}  accept " + " ".join(f"{a:.2f}" for a in last["acceptance"])
        else:
            info += "  (policy warm-up)"
        self.progress.update(self.task, completed=len(rows), info=info)


def acceptance_table(folder: str | Path) -> Table | None:
    """Acceptance per TTT step and accepted length, at the first, middle and last co-training steps."""
    rows = _acceptance_rows(read_metrics(folder))
    if not rows:
        return None
    picks = sorted({0, len(rows) // 4, len(rows) // 2, 3 * len(rows) // 4, len(rows) - 1})
    steps = min(len(r["acceptance"]) for r in rows)
    table = Table(title="draft acceptance (top-1 match with the policy, per TTT step)")
    table.add_column("step", justify="right")
    table.add_column("target loss", justify="right")
    table.add_column("draft loss", justify="right")
    for j in range(steps):
        table.add_column(f"accept@{j + 1}", justify="right")
    table.add_column("accept len", justify="right")
    table.add_column("tap bytes", justify="right")
    for i in picks:
        r = rows[i]
        table.add_row(
            str(r["step"] + 1),
            f"{r['target_loss']:.4f}",
            f"{r['draft_loss']:.4f}",
            *(f"{a:.3f}" for a in r["acceptance"][:steps]),
            f"{r['accept_len']:.3f}",
            f"{r['tap_bytes']:,}",
        )
    return table


def grpo_info(row: dict) -> str:
    """A GRPO step's figures for the progress bar (metrics.jsonl's; a missing or odd one shows as ?)."""

    def num(value, fmt: str) -> str:
        return format(value, fmt) if _is_number(value) else "?"

    found = row.get("engine")
    engine: dict = found if isinstance(found, dict) else {}
    per_pos = engine.get("acceptance_per_pos")
    positions = " ".join(num(v, ".2f") for v in per_pos[:8]) if isinstance(per_pos, list) else "?"
    return (
        f"reward {num(row.get('reward_mean'), '.3f')}±{num(row.get('reward_std'), '.3f')}  "
        f"len {num(row.get('response_length'), '.1f')}  loss {num(row.get('policy_loss'), '.3f')}  "
        f"kl {num(row.get('kl'), '.4f')}  clip {num(row.get('clip_fraction'), '.2f')}  "
        f"draft {num(row.get('draft_loss'), '.3f')}  "
        f"accept_len {num(engine.get('accept_length'), '.2f')} [{positions}]  "
        f"gen {num(row.get('generate_s'), '.1f')}s refit {num(row.get('refit_s'), '.2f')}s "
        f"train {num(row.get('train_s'), '.1f')}s {num(row.get('tokens_per_s'), '.0f')} tok/s"
    )
