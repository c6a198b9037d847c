"""Rich views of runs: the runs list, a run's status with per-rank rows, the per-rank result table, logs.

Everything shown that came from a run folder (run.json, results, metrics, markers, folder names, the Slurm answers
recorded there) goes through cli.terminal's `safe` or `plain`: no escape sequence reaches the terminal.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdraft.cli.terminal import plain, safe

STYLE = {
    "COMPLETED": "green",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "SUBMITTING": "yellow",
    "STARTING": "yellow",
    "REQUEUED": "yellow",
    "PREEMPTED": "yellow",
    "CANCELLED": "magenta",
    "TIMEOUT": "red",
    "FAILED": "red",
    "SUBMIT_FAILED": "red",
    "LOST": "red",
}


def _state(state: str) -> str:
    style = STYLE.get(state, "")
    return f"[{style}]{safe(state)}[/]" if style else safe(state)


def _rank_state(result: dict | None, job_state: str) -> str:
    if result is None:
        return (
            "running"
            if job_state == "RUNNING"
            else ("-" if job_state in ("PENDING", "SUBMITTING") else "[red]no result[/]")
        )
    if result.get("ok"):
        return "[green]ok[/]"
    stopped = result.get("preempted")
    if isinstance(stopped, dict):
        return f"[yellow]preempted (step {safe(str(stopped.get('step')))})[/]"
    return "[magenta]terminated[/]" if result.get("terminated") else "[red]FAILED[/]"


def rank_table(plan, results: dict[int, dict], job_state: str) -> Table:
    """One row per rank: placement, coordinates, result and self-test checks passed."""
    table = Table(title=f"{safe(plan.name)}: {plan.world_size} ranks")
    for col in ("rank", "node", "host", "tp", "cp", "pp", "dp", "result", "checks", "failed checks / error"):
        table.add_column(
            col,
            justify="right" if col in ("rank", "node", "tp", "cp", "pp", "dp") else "left",
            no_wrap=col != "failed checks / error",
        )
    for r in plan.ranks:
        res = results.get(r.global_rank)
        checks = (res or {}).get("checks", [])
        passed = sum(1 for c in checks if c["passed"])
        bad = [f"{c['name']}: got {c.get('value')}, expected {c.get('expected')}" for c in checks if not c["passed"]]
        if res and not res.get("ok") and not bad:
            lines = plain(res.get("error") or "").strip().splitlines()
            bad = [lines[-1] if lines else "no error recorded"]
        table.add_row(
            str(r.global_rank),
            str(r.node),
            safe((res or {}).get("hostname", "-"), one_line=True),
            str(r.tp),
            str(r.cp),
            str(r.pp),
            str(r.dp),
            _rank_state(res, job_state),
            f"{passed}/{len(checks)}" if checks else "-",
            safe(_clip(plain("; ".join(bad), one_line=True), 60)),
        )
    return table


def _short(value) -> str:
    """A metrics value for one line: 4 significant digits for floats, lists of them likewise."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def _clip(text: str, width: int) -> str:
    text = re.sub(r"\[/[^\]]*\]\s*", "", text)  # gloo prefixes its errors with a source path in brackets
    return text if len(text) <= width else text[: width - 1] + "…"


def runs_table(entries, fresh: dict) -> Table:
    """One row per run folder; ``fresh`` holds records refreshed from their executor. A folder that cannot be
    read is a row with the reason, so one broken run.json never hides the others."""
    table = Table(title=f"{len(entries)} run(s)")
    for col in ("name", "executor", "job id", "state", "submitted"):
        table.add_column(col, no_wrap=col != "state")
    for entry in entries:
        rec = fresh.get(entry.folder, entry.record)
        if rec is None:
            table.add_row(
                safe(entry.folder.name), "-", "-", f"[red]unreadable[/]: {safe(_clip(plain(entry.problem), 120))}", "-"
            )
            continue
        submitted = str(rec.submitted or "-").replace("T", " ").split("+")[0]
        table.add_row(
            safe(entry.folder.name),
            safe(rec.executor),
            safe(rec.job_id or "-"),
            _state(rec.state),
            safe(submitted),
        )
    return table


def print_status(console: Console, folder: Path, record) -> None:
    from specdraft.execute import monitor
    from specdraft.execute.report import read_results, warnings_of

    state, record, seen = monitor.current_state(folder, record)
    plan = monitor.read_plan(folder)
    results = read_results(folder, plan.world_size)
    console.print(f"[bold]run[/] {safe(folder.name)}  {safe(str(folder))}")
    nodes = f"  nodes {safe(seen.nodes)}" if seen.nodes and seen.nodes != "None assigned" else ""
    reason = f"  reason {safe(seen.reason)}" if seen.reason else ""
    console.print(
        f"{safe(record.executor)} job {safe(record.job_id or '-')}  state {_state(state)} (from "
        f"{safe(seen.source)}){reason}{nodes}  submitted {safe(str(record.submitted or '-'))}  attempt "
        f"{len(record.attempts)}  workload {safe(record.workload)}"
    )
    _print_history(console, record, monitor.restarts(record) if record.job_id else None)
    done = sum(1 for r in results.values() if r.get("ok"))
    stopped = sum(1 for r in results.values() if not r.get("ok") and isinstance(r.get("preempted"), dict))
    saved = f"{stopped} stopped at a checkpoint, " if stopped else ""
    console.print(
        f"ranks: {done}/{plan.world_size} passed, {saved}{len(results) - done - stopped} failed, "
        f"{plan.world_size - len(results)} without a result"
    )
    console.print(rank_table(plan, results, state))
    for warning in warnings_of(results):
        console.print(f"[yellow]warning[/]: {safe(_clip(plain(warning, one_line=True), 600))}")
    metrics = monitor.metrics_summary(folder)
    if metrics:
        count, last = metrics
        steps = record.steps or plan.training.train_iters
        reached = last.get("step")
        reached = reached + 1 if isinstance(reached, int) else count
        console.print(
            f"progress: step {reached}/{steps} reached ({count} step(s) in metrics.jsonl); last: "
            + safe(
                _clip(
                    plain(", ".join(f"{k}={_short(v)}" for k, v in last.items() if v is not None), one_line=True), 200
                )
            )
        )
        print_figures(console, folder, record.workload)
    newest, hashed, damaged = monitor.checkpoint_report(folder)
    for why in damaged:
        console.print(f"[red]checkpoint: {safe(why)}[/]")
    if newest is not None:
        checked = "every file's sha256 checked" if hashed else "sizes checked here, sha256 when it is loaded"
        console.print(
            f"checkpoint: {safe(newest[0])} is the newest complete one (after step "
            f"{safe(str(newest[1].get('step')))}); `specdraft launch ... --resume` continues from it ({checked})"
        )
    message = monitor.problem(folder, record, state, plan)
    if message:
        first, _, rest = message.partition("\n")
        console.print(f"[bold red]{safe(first)}[/]")
        if rest:
            console.print(plain(rest), markup=False)


def print_figures(console: Console, folder: Path, workload: str | None) -> None:
    """The run's own figures: a GRPO run's RL steps (and rollout instances), else the draft's acceptance table."""
    from specdraft.cli import grpo_view
    from specdraft.cli.cotrain_view import acceptance_table
    from specdraft.execute.monitor import read_metrics

    rows = read_metrics(folder)
    if not grpo_view.is_grpo(rows, workload):
        table = acceptance_table(folder)
        if table is not None:
            console.print(table)
        return
    warmup = grpo_view.warmup_line(rows)
    if warmup:
        console.print(warmup, markup=False)
    for found in (grpo_view.steps_table(rows), grpo_view.instances_table(rows)):
        if found is not None:
            console.print(found)


def _print_history(console: Console, record, restarts: int | None) -> None:
    """The launches into this folder (attempts, newest last) and the scheduler's own restarts of the current job."""
    shown = record.attempts[-5:]
    parts = [f"#{a.attempt} {safe(a.job_id or '-')} {_state(a.state)}" for a in shown]
    more = f"{len(record.attempts) - len(shown)} earlier, " if len(record.attempts) > len(shown) else ""
    console.print(f"attempts (launches): {len(record.attempts)}: {more}{', '.join(parts)}")
    if restarts is not None:
        console.print(f"restarts of job {safe(record.job_id or '-')} by Slurm (requeues): {restarts}")


MAX_PRINT_BYTES = 4 << 20  # `logs` without --follow prints at most the last 4 MiB of each file


def show_logs(folder: Path, record, rank: int | None, follow: bool) -> None:
    from specdraft.errors import UserError
    from specdraft.execute import monitor
    from specdraft.runs import files as runfiles

    world = record.world_size
    if rank is not None and not 0 <= rank < world:
        raise UserError(f"--rank {rank} is outside 0..{world - 1}", "pick a rank from `specdraft status`")
    ranks = [rank] if rank is not None else list(range(world))
    paths = []
    for r in ranks:
        out, err = monitor.log_paths(folder, record, r)
        paths += [(f"rank {r} stdout", out), (f"rank {r} stderr", err)]
    if not follow:
        for label, rel in paths:
            got = runfiles.read_range(folder, rel, -MAX_PRINT_BYTES, MAX_PRINT_BYTES)
            note = " (not written yet)" if got is None else ""
            if got is not None and got[1] > len(got[0]):
                note = f" (its last {len(got[0]):,} of {got[1]:,} bytes)"
            sys.stdout.write(f"==> {label}: {plain(folder / rel, one_line=True)}{note}\n")
            text = got[0].decode("utf-8", errors="replace") if got else ""
            if text:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    last = None
    for label, text in monitor.follow(folder, paths, monitor.follow_until(folder)):
        if not label:
            sys.stderr.write(f"[logs] {plain(text, one_line=True)}\n")
            break
        if label != last and len(paths) > 1:
            sys.stdout.write(f"==> {label} <==\n")
            last = label
        sys.stdout.write(text)
        sys.stdout.flush()
