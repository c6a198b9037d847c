"""sbatch through submitit: our rendered script, byte for byte, is the submission file; submitit runs sbatch and reads
the job id. The only module that imports submitit; it is loaded when a Slurm launch starts.

What specdraft uses of submitit is its executor's submission path (the submission file in the job's folder, sbatch
through its CommandFunction, job-id parsing). What it does not use is submitit's per-task wrapper
(`python -m submitit.core._submit`, which handles USR2 itself on task 0: it requeues the job and exits at once, or
raises mid-save) and so neither its pickled function nor its pickled per-task results: the script's srun runs the
rank payload directly, and the ranks write their own result files.
"""

from __future__ import annotations

from submitit.core.utils import FailedJobError, FailedSubmissionError
from submitit.slurm.slurm import SlurmExecutor

from specdraft.execute.slurm.commands import is_job_id
from specdraft.render.sbatch import SbatchRender


class SubmitRefused(RuntimeError):
    """sbatch answered no: the job does not exist (its message is sbatch's own)."""


class SubmitUnknown(RuntimeError):
    """sbatch's answer was lost or unreadable: the job may exist."""


class PlanExecutor(SlurmExecutor):
    """submitit's SlurmExecutor whose submission file is our rendered script and whose task command is the payload.

    `submit` (pickling a function for the wrapper to run) is bypassed: `_submit_command`, the step submitit's own
    `submit` takes after pickling, writes the submission file, runs sbatch and parses the job id, and pickles
    nothing. `_make_submission_file_text` returns the rendered script, whose srun line runs the task command."""

    def __init__(self, render: SbatchRender, num_tasks: int) -> None:
        super().__init__(folder=render.submitit_folder, max_num_timeout=0)
        self._render = render
        self._tasks = num_tasks

    def _num_tasks(self) -> int:
        return self._tasks

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._render.script

    def submit_script(self) -> str:
        """sbatch the rendered script; returns what submitit parsed as the job id."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return str(self._submit_command(self._render.task_command).job_id)


def make_executor(render: SbatchRender, num_tasks: int) -> PlanExecutor:
    """Built before the intent is recorded, so a machine without srun fails cleanly, with nothing to recover."""
    try:
        return PlanExecutor(render, num_tasks)
    except RuntimeError as err:  # submitit: 'Could not detect "srun", are you indeed on a slurm cluster?'
        raise SubmitRefused(str(err)) from None


def submit(executor: PlanExecutor) -> str:
    """sbatch the rendered script through submitit; every task runs render.payload_argv. Returns the job id."""
    try:
        job_id = executor.submit_script()
    except FailedJobError as err:  # submitit runs sbatch through CommandFunction: a non-zero exit lands here
        message = str(err).strip() or "sbatch failed without a message"
        if "timed out" in message.lower():
            # The controller may have queued the job before the reply was lost: not a clean "no".
            raise SubmitUnknown(message) from None
        raise SubmitRefused(message) from None
    except FailedSubmissionError as err:  # sbatch exited 0 but printed no "job N"
        raise SubmitUnknown(str(err).splitlines()[0][:300]) from None
    except Exception as err:
        raise SubmitUnknown(f"{type(err).__name__}: {err}") from err
    if not is_job_id(job_id):
        raise SubmitUnknown(f"sbatch answered with {job_id[:60]!r}, which is not a job id")
    return job_id
