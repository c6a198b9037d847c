"""Preemption: a stop request by signal, agreed by every rank at a step boundary, then the Slurm requeue.

USR2 is Slurm's time-limit warning (the sbatch script's `--signal=USR2@delay`); SIGTERM comes from a preemption,
`scontrol requeue`, `scancel` or the local launcher. Inside the training loop either one only raises a flag: at the
next step boundary one all-reduce (two numbers) tells every rank whether any rank saw one, so all stop after the
same step, save a checkpoint and exit with PREEMPTED_EXIT. Outside the loop (start-up, teardown) SIGTERM stops the
rank at once (Terminated), as before; so does a second SIGTERM inside it, the way out of a hung step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from specdraft.runs.paths import PREEMPTED_EXIT  # noqa: F401 - the exit code entry.py returns after a stop

REQUEUE_TIMEOUT_S = 30.0

_received: list[int] = []  # stop signals seen by this rank, in order
_graceful = False  # inside the training loop: SIGTERM waits for the step boundary


class Terminated(BaseException):
    """SIGTERM outside the training loop (another rank failed, or the run was cancelled): recorded, not blamed."""


def _handler(signum, frame):
    if signum == signal.SIGTERM and (not _graceful or signal.SIGTERM in _received):
        raise Terminated(f"terminated by signal {signal.Signals(signum).name}")
    _received.append(signum)


def install() -> None:
    """Handle USR2 and SIGTERM in this process from now on (USR2's default action would kill it outright)."""
    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGUSR2, _handler)


def requested() -> int | None:
    """The first stop signal this rank received, if any."""
    return _received[0] if _received else None


def terminating() -> bool:
    """SIGTERM arrived: a collective that fails now most likely lost a peer that was stopped too."""
    return signal.SIGTERM in _received


@contextlib.contextmanager
def graceful():
    """The training loop: a SIGTERM is a request to stop at the next step boundary, not an exception mid-step.

    A rank that stops because of a request stays graceful on the way out: Slurm's own SIGTERM after a requeue
    must not turn a saved, orderly exit into an error."""
    global _graceful
    _graceful = True
    try:
        yield
    finally:
        if not _received:
            _graceful = False


class StopVote:
    """The per-step agreement: did any rank receive USR2, or SIGTERM? One all-reduce (MAX) of two flags."""

    def __init__(self, device):
        self.device = device

    def agreed(self) -> int | None:
        """The signal every rank acts on after this step (USR2 wins: the job may requeue), or None to go on."""
        import torch
        import torch.distributed as dist

        flags = torch.tensor(
            [float(signal.SIGUSR2 in _received), float(signal.SIGTERM in _received)],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        usr2, term = flags.tolist()
        return signal.SIGUSR2 if usr2 else signal.SIGTERM if term else None


def stopped(rank: int, plan, signum: int, step: int, checkpoint, run_dir=None) -> dict:
    """After the agreed stop's checkpoint: rank 0 requeues the job when the signal was the time-limit warning (in a
    container: asks the batch script to, through ``run_dir``); every rank waits for it (a rank that exited first
    would make srun kill the step under rank 0's feet)."""
    import torch.distributed as dist

    requeue = None
    if signum == signal.SIGUSR2 and rank == 0:
        requeue = request_requeue(plan, os.environ, run_dir=run_dir)
        print(
            f"[specdraft] preempted after step {step}: "
            f"{'requeued' if requeue['requeued'] else 'not requeued'} ({requeue['reason']})",
            flush=True,
        )
    dist.barrier()
    # Saved and agreed: the SIGTERM Slurm sends after a requeue must not turn the orderly exit into an error.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return {
        "preempted": {
            "signal": signal.Signals(signum).name,
            "step": step,
            "checkpoint": str(checkpoint),
            "requeue": requeue,
        }
    }


# ------------------------------------------------------------------------------------------------------------------
# Slurm wiring: the job requeues itself (bounded by slurm.max_requeues); the requeued job resumes on its own.
# ------------------------------------------------------------------------------------------------------------------


def restarts(environ) -> int:
    """How many times Slurm has restarted this job (SLURM_RESTART_COUNT; 0 on the first run and off Slurm)."""
    try:
        return int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def resume_mode_from_env(environ) -> str | None:
    """A requeued job (restart count >= 1) continues from its newest checkpoint, or from step 0 if it never saved."""
    return "auto" if environ.get("SLURM_JOB_ID") and restarts(environ) >= 1 else None


def request_requeue(plan, environ, timeout_s: float = REQUEUE_TIMEOUT_S, run_dir=None) -> dict:
    """`scontrol requeue $SLURM_JOB_ID`, bounded by ``timeout_s``, when slurm.max_requeues allows one more.

    In a container (slurm.container_image) there is no Slurm client: the request goes to RUN/requeue-request, and
    the batch script, outside the container, runs `scontrol requeue` once srun returns (templates/sbatch.j2).
    Returns {"requeued": bool, "reason": str, "restarts": n}; never raises (the checkpoint is already safe)."""
    job_id = environ.get("SLURM_JOB_ID")
    done = restarts(environ)
    limit = plan.slurm.max_requeues
    if not job_id:
        return {"requeued": False, "reason": "not running under Slurm (no SLURM_JOB_ID)", "restarts": done}
    if done >= limit:
        return {
            "requeued": False,
            "restarts": done,
            "reason": f"slurm.max_requeues={limit} reached (this job was restarted {done} time(s))",
        }
    if plan.slurm.container_image:
        return _ask_the_batch_script(run_dir, job_id, done, limit)
    try:
        proc = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"requeued": False, "reason": f"scontrol requeue {job_id} failed: {err}", "restarts": done}
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
        return {"requeued": False, "reason": f"scontrol requeue {job_id}: {why}", "restarts": done}
    return {"requeued": True, "reason": f"requeue {done + 1} of at most {limit}", "restarts": done}


def _ask_the_batch_script(run_dir, job_id: str, done: int, limit: int) -> dict:
    """Leave the request the batch script reads after srun: the job id and this attempt's restart count, so a stale
    file from an earlier attempt never requeues a later one."""
    from specdraft.errors import UserError
    from specdraft.fsutil import atomic_write_text
    from specdraft.runs.paths import RunPaths

    if run_dir is None:
        return {"requeued": False, "reason": "no run folder to leave the requeue request in", "restarts": done}
    try:
        atomic_write_text(RunPaths(run_dir).requeue_request, f"{job_id} {done}\n", what="requeue request")
    except (OSError, UserError) as err:
        return {"requeued": False, "reason": f"cannot write the requeue request: {err}", "restarts": done}
    return {
        "requeued": True,
        "reason": f"requeue {done + 1} of at most {limit}, asked of the batch script (the container has no Slurm)",
        "restarts": done,
    }
