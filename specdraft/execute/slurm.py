"""Slurm through submitit: submit the rendered script byte for byte, bounded state queries, cancel, task errors."""

from __future__ import annotations

import pickle
import shlex
import subprocess
import time
from pathlib import Path

from submitit.core.utils import CommandFunction, FailedJobError, JobPaths, pickle_load
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob

from specdraft.render.sbatch import SbatchRender

# submitit's SlurmExecutor writes its own sbatch text; PlanExecutor overrides only that step
# (_make_submission_file_text) to return render.sbatch's script, after checking that the task command submitit
# expects equals the one we rendered. The rest stays submitit's: pickling the CommandFunction, sbatch, job-id
# parsing, the per-task result pickles and logs.

QUERY_TIMEOUT_S = 10.0


class SubmitRefused(RuntimeError):
    """sbatch answered no: the job does not exist (its message is sbatch's own)."""


class SubmitUnknown(RuntimeError):
    """sbatch's answer was lost or unreadable: the job may exist."""


class PlanExecutor(SlurmExecutor):
    """submitit's SlurmExecutor, with our rendered script as the sbatch file."""

    def __init__(self, render: SbatchRender, python: str, num_tasks: int, timeout_min: int) -> None:
        super().__init__(folder=render.submitit_folder, max_num_timeout=0, python=shlex.quote(python))
        self._render = render
        self._tasks = num_tasks
        # PicklingExecutor reads the limit from here to stamp the submission (submitit's timeout bookkeeping).
        self.parameters["time"] = timeout_min

    def _num_tasks(self) -> int:
        return self._tasks

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        if command != self._render.submitit_command:
            raise RuntimeError(f"submitit wants to run {command!r} but the rendered script runs "
                               f"{self._render.submitit_command!r}; this submitit version is not supported")
        return self._render.script


def make_executor(render: SbatchRender, python: str, num_tasks: int, timeout_min: int) -> PlanExecutor:
    """Built before the intent is recorded, so a machine without srun fails cleanly, with nothing to recover."""
    try:
        return PlanExecutor(render, python, num_tasks, timeout_min)
    except RuntimeError as err:  # submitit: 'Could not detect "srun", are you indeed on a slurm cluster?'
        raise SubmitRefused(str(err)) from None


def submit(executor: PlanExecutor, render: SbatchRender) -> str:
    """sbatch the rendered script through submitit; every task runs render.payload_argv. Returns the job id."""
    try:
        job = executor.submit(CommandFunction(list(render.payload_argv), verbose=True))
    except FailedJobError as err:  # submitit runs sbatch through CommandFunction: non-zero exit lands here
        message = str(err).strip() or "sbatch failed without a message"
        if "timed out" in message.lower():
            # The controller may have queued the job before the reply was lost: not a clean "no".
            raise SubmitUnknown(message) from None
        raise SubmitRefused(message) from None
    except Exception as err:  # noqa: BLE001 - anything else after sbatch ran leaves the job's existence unknown
        raise SubmitUnknown(f"{type(err).__name__}: {err}") from err
    return str(job.job_id)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None


def job_states(job_ids: list[str], timeout: float = QUERY_TIMEOUT_S) -> dict[str, dict]:
    """{job id: {"State", "NodeList", "ExitCode", "Elapsed", "source"}} from sacct (parsed by submitit's parser),
    then squeue for ids sacct does not know yet. Each call is bounded by ``timeout``; unknown ids are absent."""
    ids = [str(j) for j in job_ids if j]
    if not ids:
        return {}
    cmd = ["sacct", "-o", "JobID,State,NodeList,ExitCode,Elapsed", "--parsable2"]
    for job_id in ids:
        cmd += ["-j", job_id]
    out: dict[str, dict] = {}
    proc = _run(cmd, timeout)
    if proc is not None and proc.returncode == 0:
        for job_id, info in SlurmInfoWatcher().read_info(proc.stdout).items():
            if job_id in ids:
                out[job_id] = {**info, "source": "sacct"}
    missing = [j for j in ids if j not in out]
    if missing:
        proc = _run(["squeue", "-h", "-o", "%i|%T|%N", "-j", ",".join(missing)], timeout)
        for line in (proc.stdout.splitlines() if proc is not None and proc.returncode == 0 else []):
            job_id, state, nodes = (line.split("|") + ["", ""])[:3]
            if job_id in missing:
                out[job_id] = {"State": state, "NodeList": nodes, "source": "squeue"}
    for info in out.values():
        # sacct writes "CANCELLED by 0"; keep the state word.
        info["State"] = (info.get("State") or "UNKNOWN").split()[0]
    return out


def find_jobs(job_name: str, since_epoch: float, timeout: float = QUERY_TIMEOUT_S) -> list[tuple[str, str]]:
    """(job id, state) of jobs named ``job_name`` submitted since ``since_epoch`` (minus a minute of clock skew)."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since_epoch - 60))
    found: dict[str, str] = {}
    proc = _run(["sacct", "-X", "-n", "-P", f"--name={job_name}", "-S", since, "-o", "JobID,State"], timeout)
    for line in (proc.stdout.splitlines() if proc is not None and proc.returncode == 0 else []):
        job_id, _, state = line.partition("|")
        if job_id.strip():
            found[job_id.strip()] = state.split()[0] if state.strip() else "UNKNOWN"
    proc = _run(["squeue", "-h", "-n", job_name, "-o", "%i|%T"], timeout)
    for line in (proc.stdout.splitlines() if proc is not None and proc.returncode == 0 else []):
        job_id, _, state = line.partition("|")
        if job_id.strip():
            found.setdefault(job_id.strip(), state.strip() or "UNKNOWN")
    return sorted(found.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0)


def task_log(folder: str | Path, job_id: str, task: int, stream: str) -> Path:
    """submitit's per-task log path (stream "out" or "err")."""
    paths = JobPaths(folder, job_id=job_id, task_id=task)
    return paths.stdout if stream == "out" else paths.stderr


def task_traces(folder: str | Path, job_id: str, num_tasks: int) -> dict[int, str]:
    """Task -> the error submitit pickled for it (a FailedJobError with the payload's stderr), where one exists."""
    out = {}
    for task in range(num_tasks):
        path = JobPaths(folder, job_id=job_id, task_id=task).result_pickle
        if path.exists():
            try:
                outcome, value = pickle_load(path)
            except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
                continue  # half-written or from another submitit version: not evidence, the logs still are
            if outcome == "error":
                out[task] = str(value)
    return out


def cancel(folder: str | Path, job_id: str, num_tasks: int) -> None:
    """scancel through submitit's Job.cancel (raises CalledProcessError when scancel fails)."""
    SlurmJob(folder=folder, job_id=job_id, tasks=list(range(num_tasks))).cancel(check=True)
