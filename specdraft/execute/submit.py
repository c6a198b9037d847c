"""sbatch through submitit: submit the rendered script byte for byte, and read the errors submitit kept per task.

The only module that imports submitit; it is loaded when a Slurm launch starts or a failed Slurm run is explained.
"""

from __future__ import annotations

import pickle
import shlex
from pathlib import Path

from submitit.core.utils import CommandFunction, FailedJobError
from submitit.slurm.slurm import SlurmExecutor

from specdraft.execute import runfiles
from specdraft.execute.slurmcmd import is_job_id
from specdraft.render.sbatch import SbatchRender

# submitit's SlurmExecutor writes its own sbatch text; PlanExecutor overrides only that step
# (_make_submission_file_text) to return render.sbatch's script, after checking that the task command submitit
# expects equals the one we rendered. The rest stays submitit's: pickling the CommandFunction, sbatch, job-id
# parsing, the per-task result pickles and logs.

MAX_RESULT_PICKLE_BYTES = 16 << 20


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
    job_id = str(job.job_id)
    if not is_job_id(job_id):
        raise SubmitUnknown(f"sbatch answered with {job_id[:60]!r}, which is not a job id")
    return job_id


def task_traces(run_dir: Path, job_id: str, num_tasks: int) -> dict[int, str]:
    """Task -> the error submitit pickled for it (a FailedJobError with the payload's stderr), where one exists.

    The pickles are read like every file of a run folder (regular, no link, bounded); they are trusted as much as the
    run folder itself, since its owner's code runs in the job anyway.
    """
    out = {}
    for task in range(num_tasks):
        try:
            data = runfiles.read_bytes(run_dir, f"submitit/{job_id}_{task}_result.pkl", MAX_RESULT_PICKLE_BYTES)
        except OSError:
            continue
        if data is None:
            continue
        try:
            outcome, value = pickle.loads(data)
        except (EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError, IndexError):
            continue  # half-written or from another submitit version: not evidence, the logs still are
        if outcome == "error":
            out[task] = str(value)
    return out
