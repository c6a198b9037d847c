"""Rich views of runs: the runs list, a run's status with per-rank rows, the per-rank result table, logs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

STYLE = {"COMPLETED": "green", "RUNNING": "cyan", "PENDING": "yellow", "SUBMITTING": "yellow", "STARTING": "yellow",
         "CANCELLED": "magenta", "TIMEOUT": "red", "FAILED": "red", "SUBMIT_FAILED": "red", "LOST": "red"}


def _state(state: str) -> str:
    style = STYLE.get(state, "")
    return f"[{style}]{escape(state)}[/]" if style else escape(state)


def _rank_state(result: dict | None, job_state: str) -> str:
    if result is None:
        return "running" if job_state == "RUNNING" else ("-" if job_state in ("PENDING", "SUBMITTING") else
                                                          "[red]no result[/]")
    if result.get("ok"):
        return "[green]ok[/]"
    return "[magenta]terminated[/]" if result.get("terminated") else "[red]FAILED[/]"


def rank_table(plan, results: dict[int, dict], job_state: str) -> Table:
    """One row per rank: placement, coordinates, result and self-test checks passed."""
    table = Table(title=f"{plan.name}: {plan.world_size} ranks")
    for col in ("rank", "node", "host", "tp", "cp", "pp", "dp", "result", "checks", "failed checks / error"):
        table.add_column(col, justify="right" if col in ("rank", "node", "tp", "cp", "pp", "dp") else "left",
                         no_wrap=col != "failed checks / error")
    for r in plan.ranks:
        res = results.get(r.global_rank)
        checks = (res or {}).get("checks", [])
        passed = sum(1 for c in checks if c["passed"])
        bad = [f"{c['name']}: got {c.get('value')}, expected {c.get('expected')}" for c in checks if not c["passed"]]
        if res and not res.get("ok") and not bad:
            lines = (res.get("error") or "").strip().splitlines()
            bad = [lines[-1] if lines else "no error recorded"]
        table.add_row(str(r.global_rank), str(r.node), escape(str((res or {}).get("hostname", "-"))),
                      str(r.tp), str(r.cp), str(r.pp), str(r.dp), _rank_state(res, job_state),
                      f"{passed}/{len(checks)}" if checks else "-", escape(_clip("; ".join(bad), 60)))
    return table


def _clip(text: str, width: int) -> str:
    text = re.sub(r"\[/[^\]]*\]\s*", "", text)  # gloo prefixes its errors with a source path in brackets
    return text if len(text) <= width else text[: width - 1] + "…"


def runs_table(runs: list[tuple[Path, dict]]) -> Table:
    table = Table(title=f"{len(runs)} run(s)")
    for col in ("name", "executor", "job id", "state", "submitted"):
        table.add_column(col, no_wrap=True)
    _refresh_active(runs)
    for folder, rec in runs:
        submitted = str(rec.get("submitted") or "-").replace("T", " ").split("+")[0]
        table.add_row(escape(folder.name), escape(str(rec.get("executor"))), escape(str(rec.get("job_id") or "-")),
                      _state(rec.get("state", "?")), escape(submitted))
    return table


def _refresh_active(runs: list[tuple[Path, dict]]) -> None:
    """One bounded sacct call for every Slurm run still active, so the list shows today's states."""
    from specdraft.execute.rundir import ACTIVE, update_record

    active = {rec["job_id"]: (folder, rec) for folder, rec in runs
              if rec.get("executor") == "slurm" and rec.get("job_id") and rec.get("state") in ACTIVE}
    if not active:
        return
    from specdraft.execute.slurm import job_states

    for job_id, info in job_states(list(active)).items():
        folder, rec = active[job_id]
        if info["State"] != rec.get("state"):
            rec.update(update_record(folder, state=info["State"], attempt={"state": info["State"]}))


def print_status(console: Console, folder: Path, record: dict) -> None:
    from specdraft.execute import monitor
    from specdraft.execute.report import read_results

    state, info = monitor.current_state(folder, record)
    record = monitor.read_record(folder) or record
    plan = monitor.read_plan(folder)
    results = read_results(folder)
    attempts = len(record.get("attempts", []))
    console.print(f"[bold]run[/] {escape(folder.name)}  {escape(str(folder))}")
    nodes = f"  nodes {escape(info['NodeList'])}" if info.get("NodeList") and info["NodeList"] != "None assigned" else ""
    console.print(f"{escape(str(record.get('executor')))} job {escape(str(record.get('job_id') or '-'))}  state "
                  f"{_state(state)} (from {escape(info.get('source', 'run.json'))}){nodes}  submitted "
                  f"{escape(str(record.get('submitted') or '-'))}  attempt {attempts}  workload "
                  f"{escape(str(record.get('workload')))}")
    done = sum(1 for r in results.values() if r.get("ok"))
    console.print(f"ranks: {done}/{plan.world_size} passed, {len(results) - done} failed, "
                  f"{plan.world_size - len(results)} without a result")
    console.print(rank_table(plan, results, state))
    metrics = monitor.metrics_summary(folder)
    if metrics:
        count, last = metrics
        steps = record.get("steps") or plan.spec.training.train_iters
        console.print(f"progress: {count}/{steps} step(s) logged in metrics.jsonl; last: "
                      + escape(_clip(", ".join(f"{k}={v}" for k, v in last.items()), 200)))
        from specdraft.cli.cotrain_view import acceptance_table

        table = acceptance_table(folder)
        if table is not None:
            console.print(table)
    message = monitor.problem(folder, record, state)
    if message:
        first, _, rest = message.partition("\n")
        console.print(f"[bold red]{escape(first)}[/]")
        if rest:
            console.print(escape(rest), markup=False)


def show_logs(folder: Path, record: dict, rank: int | None, follow: bool) -> None:
    from specdraft.errors import UserError
    from specdraft.execute import monitor
    from specdraft.execute.rundir import TERMINAL

    world = int(record.get("world_size") or 1)
    if rank is not None and not 0 <= rank < world:
        raise UserError(f"--rank {rank} is outside 0..{world - 1}", "pick a rank from `specdraft status`")
    ranks = [rank] if rank is not None else list(range(world))
    paths = []
    for r in ranks:
        out, err = monitor.log_paths(folder, record, r)
        paths += [(f"rank {r} stdout", out), (f"rank {r} stderr", err)]
    if not follow:
        for label, path in paths:
            text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else None
            sys.stdout.write(f"==> {label}: {path}{'' if text is not None else ' (not written yet)'}\n")
            if text:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return

    def done() -> bool:
        state, _ = monitor.current_state(folder, monitor.read_record(folder) or record)
        return state in TERMINAL

    last = None
    for label, text in monitor.follow(paths, done):
        if label != last and len(paths) > 1:
            sys.stdout.write(f"==> {label} <==\n")
            last = label
        sys.stdout.write(text)
        sys.stdout.flush()
