"""Reading a run's outcome: per-rank result lines, which rank failed first, and the tails of its logs."""

from __future__ import annotations

import json
from pathlib import Path

TAIL_LINES = 15


def read_results(run_dir: str | Path) -> dict[int, dict]:
    """results/rank-NNNNN.json by global rank (each file is written atomically, so it is whole or absent)."""
    out: dict[int, dict] = {}
    folder = Path(run_dir) / "results"
    if folder.is_dir():
        for path in sorted(folder.glob("rank-*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(record.get("global_rank"), int):
                out[record["global_rank"]] = record
    return out


def root_cause(results: dict[int, dict], exit_order: list[int] | None = None) -> int | None:
    """The rank that failed first: a rank that raised on its own (not terminated by a signal) with the earliest
    failure time; else the first rank to exit non-zero (``exit_order``, known to the local executor)."""
    raised = [(rec.get("failed_at") or rec.get("finished_at") or 0.0, rank) for rank, rec in results.items()
              if not rec.get("ok") and not rec.get("terminated")]
    if raised:
        return min(raised)[1]
    if exit_order:
        return exit_order[0]
    failed = sorted(rank for rank, rec in results.items() if not rec.get("ok"))
    return failed[0] if failed else None


def tail(path: str | Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a text file (reads at most the last 64 KiB); [] when missing."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            data = handle.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    return text.splitlines()[-lines:] if text else []


def describe_rank(plan, rank: int) -> str:
    r = plan.ranks[rank] if 0 <= rank < len(plan.ranks) else None
    if r is None:
        return f"rank {rank}"
    return f"rank {rank} (node {r.node}, tp {r.tp} cp {r.cp} pp {r.pp} dp {r.dp})"


def failure_message(plan, results: dict[int, dict], rank: int | None, stderr_path: Path | None,
                    what: str, extra_trace: str | None = None) -> str:
    """One message: which rank failed first and why, the last lines of its stderr, what happened to the rest."""
    if rank is None:
        lines = [f"{what}; no rank recorded a failure"]
        if extra_trace:
            lines += ["--- the job's error:", *extra_trace.rstrip().splitlines()[-TAIL_LINES:]]
        return "\n".join(lines)
    record = results.get(rank, {})
    error = (record.get("error") or "").strip().splitlines()
    headline = error[-1] if error else "exited without a result line"
    lines = [f"{what}: {describe_rank(plan, rank)} failed first: {headline}"]
    log = tail(stderr_path) if stderr_path else []
    if log:
        lines += [f"--- last lines of its stderr ({stderr_path}):", *log]
    elif extra_trace:
        lines += ["--- its error:", *extra_trace.rstrip().splitlines()[-TAIL_LINES:]]
    others = sorted(r for r, rec in results.items() if r != rank and not rec.get("ok"))
    missing = plan.world_size - len(results)
    if others or missing:
        lines.append(f"--- then: {len(others)} other rank(s) failed after it"
                     + (f", {missing} rank(s) left no result (killed)" if missing else ""))
    return "\n".join(lines)
