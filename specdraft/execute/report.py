"""Reading a run's outcome: per-rank result lines, which rank failed first, and the tails of its logs.

Result files are written by the ranks, so they are read as untrusted: regular files only, bounded, and a record whose
fields have the wrong shape counts as a failed rank with that said, never as an error of specdraft.
"""

from __future__ import annotations

from pathlib import Path

from specdraft.errors import UserError
from specdraft.runs import files as runfiles
from specdraft.runs.paths import MAX_RESULT_BYTES, MAX_STEP, RESULTS, result_name

TAIL_LINES = 15
TAIL_BYTES = 65536


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _stop_ok(stopped: object) -> bool:
    """A rank's "preempted" record: {signal, step, checkpoint, requeue: {requeued, reason, restarts} or null}."""
    if stopped is None:
        return True
    if not (
        isinstance(stopped, dict)
        and isinstance(stopped.get("signal"), str)
        and _int(stopped.get("step"))
        and 0 <= stopped["step"] <= MAX_STEP
        and isinstance(stopped.get("checkpoint"), str)
    ):
        return False
    requeue = stopped.get("requeue")
    return requeue is None or (
        isinstance(requeue, dict)
        and isinstance(requeue.get("requeued", False), bool)
        and isinstance(requeue.get("reason") or "", str)
        and _int(requeue.get("restarts", 0))
    )


def _sane(record: object, rank: int) -> dict | None:
    """The result as written by the runtime, or a failed-rank stand-in naming what is wrong with it."""
    if not isinstance(record, dict) or not _int(record.get("global_rank")) or record["global_rank"] != rank:
        return None
    checks = record.get("checks", [])
    shapes_ok = (
        isinstance(record.get("ok"), bool)
        and isinstance(record.get("terminated", False), bool)
        and isinstance(checks, list)
        and all(
            isinstance(c, dict) and isinstance(c.get("passed"), bool) and isinstance(c.get("name"), str) for c in checks
        )
        and isinstance(record.get("error") or "", str)
        and isinstance(record.get("hostname", ""), str)
        and all(_number(record.get(k) or 0.0) for k in ("failed_at", "finished_at", "started_at"))
        and isinstance(record.get("slurm_job_id") or "", str)
        and _stop_ok(record.get("preempted"))
        and isinstance(record.get("warnings", []), list)
        and all(isinstance(w, str) for w in record.get("warnings", []))
    )
    if shapes_ok:
        return record
    return {
        "global_rank": rank,
        "ok": False,
        "checks": [],
        "error": f"{result_name(rank)} does not have the shape the runtime writes",
    }


def read_results(run_dir: str | Path, world_size: int) -> dict[int, dict]:
    """results/rank-NNNNN.json by global rank, for ranks 0..world_size-1 (each is written atomically, so it is
    whole or absent; one that is not JSON is skipped as not yet written)."""
    out: dict[int, dict] = {}
    if not runfiles.is_dir(run_dir, RESULTS):
        return out
    for rank in range(world_size):
        text = runfiles.read_text(run_dir, result_name(rank), MAX_RESULT_BYTES)
        if text is None:
            continue
        try:
            record = _sane(runfiles.parse_json(text, result_name(rank)), rank)
        except runfiles.BadRunFile:
            continue
        if record is not None:
            out[rank] = record
    return out


def settle(state: str, results: dict[int, dict], world_size: int) -> tuple[str, str | None]:
    """(state, why) of a run its executor saw end: a rank's result decides. COMPLETED stands only when every rank
    wrote a result and every result passed; a rank that exited 0 without writing one (a reward that called
    os._exit(0), a kill the exit code hides) makes the run FAILED, and ``why`` names the ranks."""
    if state != "COMPLETED":
        return state, None
    missing = sorted(set(range(world_size)) - set(results))
    failed = sorted(r for r, rec in results.items() if not rec.get("ok"))
    if missing:
        return "FAILED", f"rank(s) {_ranks(missing)} exited without writing a result"
    if failed:
        return "FAILED", f"rank(s) {_ranks(failed)} did not pass"
    return state, None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:10])) + (f" and {len(ranks) - 10} more" if len(ranks) > 10 else "")


def warnings_of(results: dict[int, dict]) -> list[str]:
    """The warnings the ranks recorded that changed what the run did (a data position that did not apply, a
    damaged checkpoint skipped), once each, with the ranks that gave each."""
    seen: dict[str, list[int]] = {}
    for rank, record in sorted(results.items()):
        for warning in record.get("warnings") or []:
            seen.setdefault(warning, []).append(rank)
    return [f"rank {_ranks(ranks)}: {warning}" for warning, ranks in seen.items()]


def root_cause(results: dict[int, dict], exit_order: list[int] | None = None) -> int | None:
    """The rank that failed first: a rank that raised on its own (not terminated by a signal) with the earliest
    failure time; else the first rank to exit non-zero (``exit_order``, known to the local executor)."""

    def when(rec: dict) -> float:
        value = rec.get("failed_at") or rec.get("finished_at") or 0.0
        return float(value) if isinstance(value, (int, float)) else 0.0

    raised = [(when(rec), rank) for rank, rec in results.items() if not rec.get("ok") and not rec.get("terminated")]
    if raised:
        return min(raised)[1]
    if exit_order:
        return exit_order[0]
    failed = sorted(rank for rank, rec in results.items() if not rec.get("ok"))
    return failed[0] if failed else None


def tail(run_dir: str | Path, rel: str, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a text file in the run folder (its last 64 KiB at most); [] when missing."""
    got = runfiles.read_range(run_dir, rel, -TAIL_BYTES, TAIL_BYTES)
    if got is None:
        return []
    text = got[0].decode("utf-8", errors="replace").rstrip("\n")
    return text.splitlines()[-lines:] if text else []


def describe_rank(plan, rank: int) -> str:
    r = plan.ranks[rank] if 0 <= rank < len(plan.ranks) else None
    if r is None:
        return f"rank {rank}"
    return f"rank {rank} (node {r.node}, tp {r.tp} cp {r.cp} pp {r.pp} dp {r.dp})"


def failure_message(
    plan, results: dict[int, dict], rank: int | None, run_dir: str | Path, stderr: str | None, what: str
) -> str:
    """One message: which rank failed first and why, the last lines of its stderr, what happened to the rest."""
    if rank is None:
        return f"{what}; no rank recorded a failure"
    record = results.get(rank, {})
    error = str(record.get("error") or "").strip().splitlines()
    headline = error[-1] if error else "exited without a result line"
    lines = [f"{what}: {describe_rank(plan, rank)} failed first: {headline}"]
    path = Path(run_dir) / stderr if stderr else None
    try:
        log = tail(run_dir, stderr) if stderr else []
    except UserError as err:
        log = []
        lines.append(f"--- its stderr log is refused: {err.message}")
    if log:
        lines += [f"--- last lines of its stderr ({path}):", *log]
    others = sorted(r for r, rec in results.items() if r != rank and not rec.get("ok"))
    missing = plan.world_size - len(results)
    if others or missing:
        lines.append(
            f"--- then: {len(others)} other rank(s) failed after it"
            + (f", {missing} rank(s) left no result (killed)" if missing else "")
        )
    return "\n".join(lines)
