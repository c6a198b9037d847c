"""Rules of the layout's run on Slurm: the #SBATCH words, the time limit, the job's environment, checkpointing and
requeue counts. Called by validate.validate_fields with its `err` collector."""

from __future__ import annotations

import re

from specdraft.spec.derived import slurm_time_seconds
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate.sbatch_options import option_problem as sbatch_option_problem

SLURM_WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,:@+-]*$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_STOP_GRACE_S = 86_400  # a day: longer than any save, short enough that a hung rank is killed the same day
RESERVED_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})


def slurm_rules(spec: LayoutSpec, err) -> None:
    s = spec.slurm
    for fname in ("partition", "account", "qos"):
        value = getattr(s, fname)
        if value is not None and not SLURM_WORD_RE.match(value):
            err(
                f"slurm.{fname}",
                value,
                "must be a plain Slurm name (letters, digits, '.', '_', '-', ',', ':')",
                "it goes into an #SBATCH line, where shell quoting does not apply",
            )
    if not _is_slurm_time(s.time):
        err("slurm.time", s.time, "must be a Slurm time: MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]", "e.g. 04:00:00")
    if s.cpus_per_task < 1:
        err("slurm.cpus_per_task", s.cpus_per_task, "must be >= 1", "e.g. 8 per GPU")
    for key, value in s.env.items():
        if not ENV_KEY_RE.match(key):
            err(
                f"slurm.env.{key}",
                value,
                "environment variable names are letters, digits and '_', not starting with a digit",
                "rename the variable",
            )
        if "\x00" in value:
            err(f"slurm.env.{key}", value, "must not contain NUL", "remove it")
    for fname in ("container_image",):
        value = getattr(s, fname)
        if value is not None and ("\n" in value or "\r" in value or not value.strip()):
            err(f"slurm.{fname}", value, "must be one non-empty line", "remove the line break")
    for i, mount in enumerate(s.container_mounts):
        if "\n" in mount or "\r" in mount or "," in mount or not mount.strip():
            err(
                f"slurm.container_mounts[{i}]",
                mount,
                "a mount is one SRC:DST[:FLAGS] line without commas",
                "list each mount separately",
            )
    for i, arg in enumerate(s.extra_sbatch_args):
        problem = sbatch_option_problem(arg)  # one option per element, none the script owns (getopt prefixes too)
        if problem:
            err(f"slurm.extra_sbatch_args[{i}]", arg, *problem)
    for key in s.env:
        if key in RESERVED_ENV or key.startswith(("SLURM_", "SUBMITIT_")):
            err(
                f"slurm.env.{key}",
                s.env[key],
                "specdraft's script sets this variable for the rendezvous or submitit",
                "remove it; MASTER_ADDR/MASTER_PORT come from the allocation and the job id",
            )


def _is_slurm_time(text: str) -> bool:
    try:
        slurm_time_seconds(text)
    except ValueError:
        return False
    return True


def checkpoint_rules(spec: LayoutSpec, err) -> None:
    """Checkpointing and requeue counts (runtime/train/checkpoint.py, runtime/train/preempt.py)."""
    t, s = spec.training, spec.slurm
    if t.save_interval < 0:
        err(
            "training.save_interval",
            t.save_interval,
            "must be >= 0 (steps between checkpoints; 0 turns them off)",
            "use 0, or e.g. 100",
        )
    if t.keep_checkpoints < 1:
        err(
            "training.keep_checkpoints",
            t.keep_checkpoints,
            "must be >= 1 (a resume needs at least one)",
            "use 2: the newest and the one before, should the newest be damaged",
        )
    if not 0 < t.stop_grace_s <= MAX_STOP_GRACE_S:
        err(
            "training.stop_grace_s",
            t.stop_grace_s,
            f"must be in (0, {MAX_STOP_GRACE_S:,}] seconds (the ranks' step and save before they are killed)",
            "use 300; raise it if a save of this model takes longer",
        )
    if s.max_requeues < 0:
        err("slurm.max_requeues", s.max_requeues, "must be >= 0 (0 never requeues)", "use 0, or e.g. 3")
