"""The executor interface (Slurm, local) and the one registry that picks one by name.

Everything that differs between running a plan on Slurm and on this machine lives behind `Executor`; the launch use
case, the monitor and the CLI call its methods and never compare executor names. Implementations are imported only
when chosen, so `--dry-run`, `status` and a local launch never import submitit.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from specdraft.errors import UserError
from specdraft.execute.request import LaunchRequest
from specdraft.plan.model import LaunchPlan
from specdraft.runs.record import RunRecord

# name -> "module:class".
REGISTRY = {"slurm": "specdraft.execute.slurm.executor:SlurmExecutor", "local": "specdraft.execute.local:LocalExecutor"}


@dataclass(frozen=True)
class Observation:
    """A run's state now, as its executor sees it (bounded queries)."""

    state: str
    source: str  # where the state comes from: sacct, squeue, run.json (...)
    nodes: str = ""
    reason: str = ""  # why a pending job waits (Slurm's %r)
    job_id: str | None = None  # a job found by name after an interrupted submission
    note: str | None = None  # recorded as the run's message when the state changes
    gone: bool = False  # the scheduler answered and no longer knows the job: nothing more will come


@dataclass(frozen=True)
class Progress:
    """One progress report while a launch runs or waits."""

    executor: str
    elapsed_s: float
    state: str
    summary: str  # e.g. "ranks: 3 running, 1 done, 0 failed" or "job 7 PENDING (Resources), 0/4 rank result(s)"
    heartbeat: bool = False  # a periodic report with nothing new (shown so a slow start does not look like a hang)


ProgressFn = Callable[[Progress], None]


class Executor(ABC):
    """How a plan runs somewhere. One instance per launch or query (it may keep what `ready` prepared)."""

    name: ClassVar[str]
    runs_in_launcher: ClassVar[bool]  # the launcher process is the job (it holds the launch lock throughout)
    intent_state: ClassVar[str]  # the state recorded before `start`

    @abstractmethod
    def default_python(self, plan: LaunchPlan, explicit: str | None) -> str:
        """The interpreter the ranks run under."""

    def dry_run_notes(self) -> list[str]:
        """Extra lines `--dry-run` prints about how this executor runs the command."""
        return []

    def intent_files(self, request: LaunchRequest) -> dict[str, tuple[str, int]]:
        """Files written with the intent, besides plan.json: name -> (text, mode)."""
        return {}

    def ready(self, request: LaunchRequest, warn: Callable[[str], None]) -> None:
        """Checks before the run folder is touched (raise UserError when the run cannot start here)."""
        return None

    @abstractmethod
    def start(self, request: LaunchRequest, on_progress: ProgressFn) -> RunRecord:
        """Start the run (under the launch lock, after the intent); returns the record once started (submitted,
        or, for an executor that runs in the launcher, ended)."""

    @abstractmethod
    def observe(self, run_dir: Path, record: RunRecord, *, launching: bool = False) -> Observation:
        """The run's state now; ``launching``: the caller holds the launch lock (so no launcher of ours runs)."""

    def observe_many(self, runs: list[tuple[Path, RunRecord]]) -> dict[Path, Observation]:
        """``observe`` for several runs (an executor may batch its queries)."""
        return {folder: self.observe(folder, record) for folder, record in runs}

    @abstractmethod
    def cancel(self, run_dir: Path, record: RunRecord) -> tuple[str, str | None]:
        """Stop the run; returns a one-line account and the state to record (None: the launcher records it)."""

    @abstractmethod
    def log_paths(self, record: RunRecord, rank: int) -> tuple[str, str]:
        """(stdout, stderr) of one rank, relative to the run folder."""

    def restarts(self, record: RunRecord) -> int | None:
        """How often the scheduler restarted the run's job by itself (Slurm requeues); None: not known, or an
        executor that never restarts a run."""
        return None

    def started_summary(self, record: RunRecord, plan: LaunchPlan) -> str:
        """One line saying what was started."""
        return f"started {plan.world_size} rank(s): {record.describe_job()}"


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def executor_class(name: str) -> type[Executor]:
    if name not in REGISTRY:
        raise UserError(f"executor {name[:40]!r} is unknown", f"use one of: {', '.join(REGISTRY)}")
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def get(name: str) -> Executor:
    """A fresh executor of that name."""
    return executor_class(name)()


def choose(requested: str | None, layout: str | None = None) -> tuple[Executor, str]:
    """(executor, why): `--executor`, else the layout's cluster.executor; with neither, UserError. specdraft never
    picks one because it answers: a Slurm controller that happens to reach this machine is not the user's choice."""
    for name, where in ((requested, "--executor"), (layout, "cluster.executor")):
        if name is None:
            continue
        if name not in REGISTRY:
            raise UserError(
                f"{where} {name[:40]!r} is not an executor", " or ".join(f"use {where} {n}" for n in REGISTRY)
            )
        why = "requested" if where == "--executor" else "the layout's cluster.executor"
        if where == "--executor" and layout is not None and layout != name:
            why += f", over the layout's cluster.executor {layout}"
        return get(name), why
    raise UserError(
        "no executor chosen: the layout sets no cluster.executor and --executor was not given, and specdraft never "
        "picks a cluster by itself",
        "pass --executor local (this machine) or --executor slurm, or set cluster.executor: local | slurm in the "
        "layout",
    )
