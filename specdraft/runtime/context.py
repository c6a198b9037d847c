"""RankContext: what runtime.entry hands a workload's `run(ctx)`; plain data, no torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specdraft.plan.model import LaunchPlan, RankPlacement
from specdraft.runs.paths import RunPaths


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """One rank's view of the launch.

    A workload is `run(ctx: RankContext) -> dict | None`, registered by name in runtime.entry.WORKLOADS. While it
    runs, torch.distributed and megatron's parallel_state are initialised with the plan's layout; a returned dict
    is merged into the rank's result line (a "checks" list of {name, value, expected, passed} decides `ok`).
    The rank process then exits without interpreter finalisation (runtime.entry.exit_now): close what you write.
    """

    plan: LaunchPlan
    """The whole plan, read through LaunchPlan.from_json (schema_version checked)."""
    run_dir: Path
    """The run folder (plan.json's directory); a workload writes its files under it."""
    global_rank: int
    """This process's rank in the world (SLURM_PROCID or RANK)."""
    local_rank: int
    """Rank on its node (SLURM_LOCALID or LOCAL_RANK); the CUDA device index on GPU."""
    world_size: int
    """Number of ranks; equals plan.world_size (entry checks it)."""
    node: int
    """Node index in the allocation (SLURM_NODEID, GROUP_RANK for the local executor)."""
    device: str
    """"cpu" or "cuda:<local_rank>" (already made current on GPU)."""
    backend: str
    """torch.distributed backend: "gloo" on CPU, "nccl" on GPU."""
    steps: int
    """Optimizer steps to run: `specdraft launch --steps`, else the plan's training.train_iters."""
    workload: str
    """The registered workload name being run (e.g. "selftest", "cotrain")."""
    resume: Optional[str] = None
    """None: start at step 0; "newest" (--resume): this run folder's newest complete checkpoint; "from"
    (--resume-from): the checkpoint folder `resume_from`; "auto" (a requeued Slurm job): the newest, else step 0."""
    resume_from: Optional[Path] = None
    """The checkpoint folder of --resume-from (any run, any layout of the same model shape)."""
    data: Optional[Any] = None
    """The plan's data file tokenised, read by entry before any collective: cotrain's samples
    (runtime.train.corpus.Corpus) or grpo's prompts (runtime.rl.prompts.PromptFile); None without a data file."""
    allow_data_change: bool = False
    """`launch --allow-data-change`: a resume may continue with a data file other than the checkpoint's (its data
    then starts at the first sample); without it that resume is refused."""
    warnings: list[str] = field(default_factory=list)
    """What this rank did other than it was asked (a data position that did not apply, a damaged checkpoint
    skipped): entry writes them into the rank's result, and the launcher prints them."""

    @property
    def coords(self) -> RankPlacement:
        """This rank's record in the plan: global_rank, node, local_rank, tp, cp, dp, pp, ep, etp, edp."""
        return self.plan.ranks[self.global_rank]

    @property
    def paths(self) -> RunPaths:
        """Every name in the run folder (runs/paths.py)."""
        return RunPaths(self.run_dir)

    @property
    def results_dir(self) -> Path:
        """Where entry writes one result file per rank (results/rank-00000.json)."""
        return self.paths.results

    @property
    def metrics_path(self) -> Path:
        """JSON-lines progress file (one object per step, with a "step" key) that `specdraft status` summarises."""
        return self.paths.metrics
