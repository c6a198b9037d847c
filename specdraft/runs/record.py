"""run.json: the typed, versioned record of a run (RunRecord), read strictly and written atomically.

Decoding reuses the plan's codec (every field present, every type right) and then checks bounds, so a run.json that
is a list, has a field of the wrong type, a `world_size` of 1e9 or a job id such as "--user=root" is refused with a
UserError (exit 2) before anything acts on it. Only execute/ writes it, through `update_record`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specdraft.errors import UserError
from specdraft.fsutil import atomic_write_text
from specdraft.plan.codec import PlanFormatError, decode, encode_value
from specdraft.runs import files as runfiles
from specdraft.runs.paths import MAX_RECORD_BYTES, MAX_STEP, MAX_WORLD_SIZE, RECORD

RECORD_VERSION = 1
MAX_ATTEMPTS = 10_000
MAX_TEXT = 4096  # sbatch's message and the like, as stored
# What sbatch prints and sacct lists: digits, an array task (`_N`) or a heterogeneous component (`+N`).
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,12}|\+[0-9]{1,6})?")
_LOCAL_JOB = re.compile(r"local-[0-9]{1,10}")
_STATE = re.compile(r"[A-Z_]{1,40}")
_NAME = re.compile(r"[^\x00-\x1f\x7f%]{1,300}")


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One launch into the run folder (a --force relaunch adds one)."""

    attempt: int
    executor: str
    job_id: Optional[str]
    state: str
    intent: str
    submitted: Optional[str] = None
    ended: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class LocalProcesses:
    """A local run's process group: `cancel` signals it; pids are informational."""

    pgid: int
    pids: tuple[int, ...]
    launcher_pid: int


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What run.json holds (docs/launch.md, "The run folder")."""

    record_version: int
    name: str
    run_dir: str
    executor: str
    job_id: Optional[str]  # a Slurm job id, or local-<pgid>
    job_name: str
    state: str
    intent_epoch: float  # when the intent was recorded; an interrupted submission is looked up from here
    submitted: Optional[str]
    updated: str
    plan_hash: str
    spec_sha256: str
    specdraft_version: str
    world_size: int
    workload: str
    steps: Optional[int]
    attempts: tuple[Attempt, ...]
    message: Optional[str]
    cancel_requested: bool
    local: Optional[LocalProcesses]
    exit_codes: tuple[int, ...]  # local: each rank's exit code, by rank
    exit_order: tuple[int, ...]  # local: ranks in the order they exited non-zero
    elapsed_s: Optional[float]

    def describe_job(self) -> str:
        return f"job {self.job_id}" if self.job_id else "no job id recorded"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _no_spec(data: Any, path: str) -> Any:
    raise PlanFormatError(f"{path}: a run record holds no layout")


def _problems(record: RunRecord) -> list[str]:
    """Bounds and shapes the types alone do not say."""
    out = []
    if not 1 <= record.world_size <= MAX_WORLD_SIZE:
        out.append(f"world_size {record.world_size} is outside 1..{MAX_WORLD_SIZE:,}")
    ids = [("job_id", record.job_id)] + [(f"attempts[{i}].job_id", a.job_id) for i, a in enumerate(record.attempts)]
    for where, job_id in ids:
        if job_id is not None and not (JOB_ID.fullmatch(job_id) or _LOCAL_JOB.fullmatch(job_id)):
            out.append(f"{where} {job_id[:60]!r} is neither a Slurm job id nor local-<pgid>")
    states = [("state", record.state)] + [(f"attempts[{i}].state", a.state) for i, a in enumerate(record.attempts)]
    out += [f"{where} {state[:40]!r} is not a job state" for where, state in states if not _STATE.fullmatch(state)]
    for where, text in (
        ("name", record.name),
        ("job_name", record.job_name),
        ("executor", record.executor),
        ("workload", record.workload),
    ):
        if not _NAME.fullmatch(text):
            out.append(f"{where} {text[:60]!r} is empty, too long or holds a control character or '%'")
    if len(record.attempts) > MAX_ATTEMPTS:
        out.append(f"{len(record.attempts)} attempts (at most {MAX_ATTEMPTS})")
    if record.steps is not None and not 1 <= record.steps <= MAX_STEP:
        out.append(f"steps {record.steps} is outside 1..{MAX_STEP:,}")
    if not math.isfinite(record.intent_epoch):
        out.append("intent_epoch is not a finite time")
    if record.local is not None and (record.local.pgid < 2 or len(record.local.pids) > record.world_size):
        out.append(f"local.pgid {record.local.pgid} or its {len(record.local.pids)} pids are not a run's")
    if len(record.exit_codes) > record.world_size or any(not 0 <= r < record.world_size for r in record.exit_order):
        out.append("exit_codes/exit_order name ranks outside the world")
    return out


def parse_record(text: str, source: str) -> RunRecord:
    """run.json text -> RunRecord; UserError naming the first thing wrong."""
    fix = (
        "specdraft writes it atomically, so it was edited by hand or by another program: restore it, or remove "
        "the run folder"
    )
    data = runfiles.parse_json(text, source, fix)
    if not isinstance(data, dict):
        raise UserError(f"{source} is a JSON {type(data).__name__}, not a run record", fix)
    version = data.get("record_version")
    if version != RECORD_VERSION:
        raise UserError(
            f"{source} has record_version {str(version)[:20]}, but this specdraft reads record_version "
            f"{RECORD_VERSION}",
            "it was written by another specdraft version; use that version, or remove the run folder",
        )
    try:
        record = decode(RunRecord, data, "run", spec_decoder=_no_spec)
    except (PlanFormatError, RecursionError) as err:
        raise UserError(f"{source} is not a run record: {str(err)[:300]}", fix) from None
    problems = _problems(record)
    if problems:
        raise UserError(f"{source} is not a run record: {'; '.join(problems[:4])}", fix)
    return record


def read_record(run_dir: str | Path) -> RunRecord | None:
    """The run's record, or None when run.json does not exist (a link, FIFO or device is refused by name)."""
    text = runfiles.read_text(run_dir, RECORD, MAX_RECORD_BYTES)
    return None if text is None else parse_record(text, str(Path(run_dir) / RECORD))


def new_record(**fields) -> RunRecord:
    """A record with every optional field empty, then ``fields``."""
    empty = dict(
        record_version=RECORD_VERSION,
        job_id=None,
        submitted=None,
        updated=now_iso(),
        steps=None,
        attempts=(),
        message=None,
        cancel_requested=False,
        local=None,
        exit_codes=(),
        exit_order=(),
        elapsed_s=None,
    )
    return RunRecord(**{**empty, **fields})


def write_record(run_dir: str | Path, record: RunRecord) -> RunRecord:
    """Stamp ``updated`` and write run.json atomically (the caller holds the record lock)."""
    record = dataclasses.replace(
        record, updated=now_iso(), message=None if record.message is None else record.message[:MAX_TEXT]
    )
    atomic_write_text(Path(run_dir) / RECORD, json.dumps(encode_value(record), indent=1) + "\n", what="run record")
    return record
