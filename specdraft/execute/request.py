"""LaunchRequest: everything one launch needs, decided before anything is written (execute.launch.prepare)."""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.plan.model import LaunchPlan
from specdraft.render.sbatch import SbatchRender


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """Everything one launch needs, decided before anything is written."""

    plan: LaunchPlan
    executor: str
    executor_why: str
    run_dir: str  # absolute, normalised
    python: str  # the interpreter every rank runs
    workload: str
    steps: int | None
    force: bool  # relaunch into a folder whose job has ended
    resume: bool  # --resume: continue this run folder from its newest complete checkpoint
    resume_from: str | None  # --resume-from: start from this checkpoint folder (absolute)
    allow_data_change: bool = False  # --allow-data-change: a resume may continue with another data file
    checkpoint: str | None  # the checkpoint the run is expected to continue from (checked before anything is written)
    notes: tuple[str, ...]  # warnings found while checking (a damaged checkpoint that will be skipped)
    waits: bool  # the launch returns only once the run ended (--wait, or an executor that runs in the launcher)
    render: SbatchRender  # the script and the payload argv, a pure function of the fields above
