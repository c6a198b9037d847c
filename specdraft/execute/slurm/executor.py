"""The Slurm executor: preflight, submit through submitit, bounded state queries (and the job's restarts), scancel,
the per-task logs srun writes.

submitit is imported only by `ready`/`start` (execute.submit); state, restarts and cancel go through
execute.slurmcmd, whose every call is bounded and whose job ids can never be options.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from specdraft.errors import UserError
from specdraft.execute.executor import Executor, Observation, ProgressFn
from specdraft.execute.slurm import commands as slurmcmd
from specdraft.runs.paths import SBATCH, SUBMITIT
from specdraft.runs.record import RunRecord, now_iso
from specdraft.runs.rundir import TERMINAL, update_record

if TYPE_CHECKING:  # submitit is imported only when a job is submitted
    from specdraft.execute.slurm.submit import PlanExecutor


class SlurmExecutor(Executor):
    name = "slurm"
    runs_in_launcher = False
    intent_state = "SUBMITTING"

    def __init__(self) -> None:
        self._submitit: PlanExecutor | None = None

    def default_python(self, plan, explicit: str | None) -> str:
        """--python, else `python` inside a container image, else this interpreter (the venv's, on a shared FS)."""
        if explicit:
            return explicit
        return "python" if plan.slurm.container_image else sys.executable

    def intent_files(self, request) -> dict[str, tuple[str, int]]:
        return {SBATCH: (request.render.script, 0o755)}

    def ready(self, request, warn: Callable[[str], None]) -> None:
        """Build submitit's executor (a machine without srun fails here, with nothing written) and ask the cluster
        whether the request could ever run (preflight: an impossible one is exit 2, nothing written or submitted)."""
        from specdraft.execute.slurm import preflight, submit

        plan = request.plan
        _check_container_paths(request)
        try:
            self._submitit = submit.make_executor(request.render, plan.world_size)
        except submit.SubmitRefused as err:
            raise UserError(
                f"cannot submit to Slurm here: {err}", "run on a Slurm login node, or use --executor local"
            ) from None
        preflight.require(plan, warn, after="; nothing was submitted")

    def start(self, request, on_progress: ProgressFn) -> RunRecord:
        from specdraft.execute.slurm import submit

        run_dir = request.run_dir
        if self._submitit is None:
            raise RuntimeError("SlurmExecutor.start before ready: no submitit executor was built")
        try:
            job_id = submit.submit(self._submitit)
        except submit.SubmitRefused as err:
            update_record(run_dir, state="SUBMIT_FAILED", message=str(err), attempt={"state": "SUBMIT_FAILED"})
            raise UserError(
                f"sbatch refused the job: {err}",
                "fix the slurm section of the layout (partition, account, qos, time, resources); "
                "`sinfo` lists partitions",
            ) from None
        except submit.SubmitUnknown as err:
            update_record(run_dir, message=f"submission interrupted: {err}")
            raise UserError(
                f"the submission of {run_dir} was interrupted after sbatch ran ({err}); the job may exist",
                f"run `specdraft status {run_dir}` (it looks the job up by name) before launching again",
            ) from None
        return update_record(
            run_dir,
            job_id=job_id,
            state="PENDING",
            submitted=now_iso(),
            attempt={"job_id": job_id, "state": "PENDING", "submitted": now_iso()},
        )

    def started_summary(self, record: RunRecord, plan) -> str:
        return (
            f"submitted Slurm job {record.job_id}: {plan.world_size} task(s) on {plan.cluster.num_nodes} "
            f"node(s), partition {plan.slurm.partition or '(default)'}"
        )

    def _recover(self, record: RunRecord) -> tuple[str | None, str | None]:
        """(job id, recovered id) after an interrupted submission: the newest job of the run's name since the
        intent, looked up in sacct and squeue."""
        if record.state != "SUBMITTING":
            return record.job_id, None
        jobs = slurmcmd.find_jobs(record.job_name, record.intent_epoch)
        if not jobs:
            return record.job_id, None
        return jobs[-1][0], jobs[-1][0]

    def _observation(
        self, record: RunRecord, job_id: str | None, recovered: str | None, census: slurmcmd.Census | None
    ) -> Observation:
        note = f"recovered job {recovered} by name after an interrupted submission" if recovered else None
        if not job_id:
            return Observation(record.state, "run.json (no job of this run's name in sacct/squeue)")
        info = census.jobs.get(job_id) if census else None
        if info:
            return Observation(info.state, info.source, info.nodes, info.reason, job_id=recovered, note=note)
        if census is not None and census.answered and record.state not in TERMINAL:
            return Observation(
                record.state,
                f"run.json (sacct and squeue no longer know job {job_id})",
                job_id=recovered,
                note=note,
                gone=True,
            )
        return Observation(record.state, "run.json (sacct/squeue did not answer)", job_id=recovered, note=note)

    def observe(self, run_dir: Path, record: RunRecord, *, launching: bool = False) -> Observation:
        job_id, recovered = self._recover(record)
        census = slurmcmd.job_states([job_id]) if job_id else None
        return self._observation(record, job_id, recovered, census)

    def observe_many(self, runs: list[tuple[Path, RunRecord]]) -> dict[Path, Observation]:
        """One sacct (and at most one squeue) call for every run with a job id; SUBMITTING ones one by one."""
        ids = {folder: self._recover(record) for folder, record in runs}
        census = slurmcmd.job_states(sorted({job for job, _ in ids.values() if job}))
        return {folder: self._observation(record, *ids[folder], census) for folder, record in runs}

    def cancel(self, run_dir: Path, record: RunRecord) -> tuple[str, str | None]:
        if not record.job_id:
            raise UserError(
                f"{run_dir} has no job id yet (state {record.state})",
                "run `specdraft status` first; it looks an interrupted submission up by name",
            )
        slurmcmd.cancel(record.job_id)
        return f"cancelled Slurm job {record.job_id}", "CANCELLED"

    def log_paths(self, record: RunRecord, rank: int) -> tuple[str, str]:
        # The names the rendered script gives srun (--output=RUN/submitit/%j_%t_log.out; submitit's convention).
        job = record.job_id or "none"
        return f"{SUBMITIT}/{job}_{rank}_log.out", f"{SUBMITIT}/{job}_{rank}_log.err"

    def restarts(self, record: RunRecord) -> int | None:
        """How often Slurm restarted the job (requeues), from scontrol, else sacct; None when neither knows."""
        return slurmcmd.restarts(record.job_id) if record.job_id else None


def _check_container_paths(request) -> None:
    """In a container the ranks see only the run folder and slurm.container_mounts: a --resume-from checkpoint
    elsewhere would be missing there (model.path and data.path are validate's: spec/validate/container.py)."""
    from specdraft.spec.validate.container import mount_target, under

    slurm = request.plan.slurm
    if not slurm.container_image or request.resume_from is None:
        return
    targets = [t for t in map(mount_target, slurm.container_mounts) if t] + [request.run_dir]
    if not any(under(request.resume_from, t) for t in targets):
        raise UserError(
            f"--resume-from {request.resume_from} is not visible inside the container {slurm.container_image}: it "
            "lies under neither the run folder nor any DST of slurm.container_mounts",
            "add a mount that holds it (slurm.container_mounts=[SRC:DST]), or copy the checkpoint under one",
        )
