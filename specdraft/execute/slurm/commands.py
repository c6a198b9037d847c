"""Slurm's command-line tools, bounded: job ids checked as Slurm writes them, no value that can be an option.

Every call here has a timeout, so an unresponsive controller costs seconds, never a hang. Job ids reach `sacct` and
`squeue` as `--jobs=ID` (the `=` binds the value to the option) and `scancel` after `--`, and only ids that match
JOB_ID ever get that far. No submitit import: `status`, `runs`, `logs` and `cancel` need none.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

from specdraft.errors import UserError
from specdraft.runs.paths import RECORD
from specdraft.runs.record import JOB_ID

QUERY_TIMEOUT_S = 10.0  # each sacct/squeue/sinfo/scontrol call
CANCEL_TIMEOUT_S = 20.0  # scancel waits for the controller's answer; an unresponsive one would hold it for minutes
_REASON = re.compile(r"[\x00-\x1f\x7f]")


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def check_job_id(value: object, where: str = RECORD) -> str:
    """``value`` if it is a Slurm job id; a UserError naming it otherwise (it would reach scancel/sacct)."""
    if not is_job_id(value):
        shown = repr(value)[:60]
        raise UserError(
            f"{where}: job_id {shown} is not a Slurm job id (digits, optionally _N or +N)",
            "this record was edited by hand; restore the id sbatch printed, or remove the run folder",
        )
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class Answer:
    """One tool's answer: None when it did not answer in time or could not start."""

    returncode: int
    stdout: str
    stderr: str


def run(cmd: list[str], timeout: float | None = None) -> Answer | None:
    """Run a Slurm tool with a bound (QUERY_TIMEOUT_S by default); None when it timed out or is not installed."""
    timeout = QUERY_TIMEOUT_S if timeout is None else timeout
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    return Answer(proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class JobInfo:
    """What Slurm says about one job now."""

    state: str
    nodes: str = ""
    reason: str = ""  # squeue's %r: why a pending job waits (Resources, Priority, JobHeldUser, ...)
    source: str = "sacct"


@dataclass(frozen=True)
class Census:
    """job id -> JobInfo for the ids Slurm knows; ``answered`` says whether both tools replied at all."""

    jobs: dict[str, JobInfo]
    answered: bool


def _state_word(text: str) -> str:
    # sacct writes "CANCELLED by 0"; keep the state word.
    words = text.split()
    return words[0] if words else "UNKNOWN"


def job_states(job_ids: list[str], timeout: float | None = None) -> Census:
    """One sacct call for all ids, then one squeue call for the ids that are pending or unknown to sacct (squeue
    knows a job sacct has not caught up with yet, and it alone gives the pending reason)."""
    ids = [check_job_id(j) for j in job_ids]
    if not ids:
        return Census({}, True)
    out: dict[str, JobInfo] = {}
    answered = True
    sacct = run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,NodeList", f"--jobs={','.join(ids)}"], timeout)
    if sacct is not None and sacct.returncode == 0:
        for line in sacct.stdout.splitlines():
            job_id, state, nodes = (line.split("|") + ["", ""])[:3]
            if job_id in ids:
                out[job_id] = JobInfo(_state_word(state), nodes, "", "sacct")
    else:
        answered = False
    ask = [j for j in ids if j not in out or out[j].state == "PENDING"]
    if ask:
        squeue = run(["squeue", "-h", "-o", "%i|%T|%N|%r", f"--jobs={','.join(ask)}"], timeout)
        if squeue is None or (squeue.returncode != 0 and "invalid job id" not in squeue.stderr.lower()):
            answered = False  # squeue exits 1 with "Invalid job id specified" for ids it no longer lists
        for line in squeue.stdout.splitlines() if squeue is not None else []:
            job_id, state, nodes, reason = (line.split("|", 3) + ["", "", ""])[:4]
            if job_id in ask:
                reason = _REASON.sub(" ", reason.strip())[:200]
                known = out.get(job_id)
                source = "sacct" if known else "squeue"
                out[job_id] = JobInfo(
                    known.state if known else _state_word(state),
                    nodes or (known.nodes if known else ""),
                    "" if reason in ("None", "(null)") else reason,
                    source,
                )
    return Census(out, answered)


def find_jobs(job_name: str, since_epoch: float, timeout: float | None = None) -> list[tuple[str, str]]:
    """(job id, state) of jobs named ``job_name`` submitted since ``since_epoch`` (minus a minute of clock skew)."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since_epoch - 60))
    found: dict[str, str] = {}
    sacct = run(["sacct", "-X", "-n", "-P", f"--name={job_name}", f"--starttime={since}", "-o", "JobID,State"], timeout)
    for line in sacct.stdout.splitlines() if sacct is not None and sacct.returncode == 0 else []:
        job_id, _, state = line.partition("|")
        if is_job_id(job_id.strip()):
            found[job_id.strip()] = _state_word(state)
    squeue = run(["squeue", "-h", f"--name={job_name}", "-o", "%i|%T"], timeout)
    for line in squeue.stdout.splitlines() if squeue is not None and squeue.returncode == 0 else []:
        job_id, _, state = line.partition("|")
        if is_job_id(job_id.strip()):
            found.setdefault(job_id.strip(), _state_word(state))
    return sorted(found.items(), key=lambda item: [int(p) for p in re.split(r"[_+]", item[0])])


def restarts(job_id: str, timeout: float | None = None) -> int | None:
    """How many times Slurm restarted the job (a requeue, a preemption): sacct --duplicates lists one row per run
    of a job id, so the rows minus one (scontrol's Restarts= forgets the job MinJobAge after it ends). None when
    sacct did not answer or does not know the job."""
    check_job_id(job_id)
    sacct = run(["sacct", "-X", "-n", "-P", "--duplicates", "-o", "JobID", f"--jobs={job_id}"], timeout)
    if sacct is None or sacct.returncode != 0:
        return None
    runs = sum(1 for line in sacct.stdout.splitlines() if line.strip() == job_id)
    return runs - 1 if runs else None


def cancel(job_id: str, timeout: float | None = None) -> None:
    """scancel one job; UserError when scancel fails or does not answer within ``timeout`` (CANCEL_TIMEOUT_S)."""
    check_job_id(job_id)
    timeout = CANCEL_TIMEOUT_S if timeout is None else timeout
    answer = run(["scancel", "--", job_id], timeout)
    if answer is None:
        raise UserError(
            f"scancel {job_id} did not answer within {timeout:g} s (the Slurm controller is busy or "
            "down); the job may still be queued or running",
            f"check with `squeue --jobs={job_id}` and run `specdraft cancel` again",
        )
    if answer.returncode != 0:
        detail = (answer.stderr.strip().splitlines() or [f"exit {answer.returncode}"])[-1][:300]
        raise UserError(f"scancel {job_id} failed: {detail}", f"`squeue --jobs={job_id}` shows the job")
