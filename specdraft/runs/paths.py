"""The run folder's protocol, named once: every file and folder name in it, the size limits its readers enforce,
the ranks' exit codes, and RunPaths (like submitit's JobPaths): one run folder, with containment checks."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from specdraft.errors import UserError
from specdraft.spec.bounds import MAX_WORLD_SIZE  # noqa: F401 - the one bound on ranks; run files are read against it

# RUN/.specdraft-run plan.json run.json sbatch.sh .launch.lock .record.lock .specdraft-reserve metrics.jsonl
# results/rank-NNNNN.json logs/rank-N.{out,err} (local) submitit/ (Slurm) attempts/<n>/ checkpoints/step-N/
# draft/step-N/ taps/ requeue-request (container mode) rl/{policy,draft}/ rl/rollouts.jsonl (GRPO)
RUN_MARKER = ".specdraft-run"  # makes a folder specdraft's (runs/rundir.py)
PLAN = "plan.json"
RECORD = "run.json"
SBATCH = "sbatch.sh"
LAUNCH_LOCK = ".launch.lock"
RECORD_LOCK = ".record.lock"
RESERVE = ".specdraft-reserve"  # room kept to record a run whose disk filled up (execute/diskspace.py)
METRICS = "metrics.jsonl"  # one JSON object per step; a checkpoint holds rows 0..N-1 under the same name
RESULTS = "results"
LOGS = "logs"
SUBMITIT = "submitit"
ATTEMPTS = "attempts"
CHECKPOINTS = "checkpoints"
CHECKPOINT_MARKER = "specdraft-checkpoint.json"  # written last: a step folder without it does not count
DRAFTS = "draft"  # RUN/draft/step-N/: the drafts published while training, for a rollout engine to reload
TAPS = "taps"  # the TapChannel's audit log (SPECDRAFT_TAP_AUDIT=1)
# Rank 0 in a container (no Slurm client there) asks the batch script, outside it, to requeue the job: one line,
# "<job id> <restart count>", which the script compares with its own before it runs `scontrol requeue`.
REQUEUE_REQUEST = "requeue-request"
# RUN/serve-cache/vllm/{policy,draft}/: the exports `rollout measure --engine vllm` serves, kept for reuse
SERVE_CACHE = "serve-cache"
# RUN/rl/: GRPO's own files. policy/ and draft/ are the HF and EAGLE-3 folders the rollout engines start from
# (config.json only: the weights reach the engines by refit);
# rollouts.jsonl holds one JSON object per sample (step, instance, policy_version, prompt_text, response_text,
# answer, reward, prompt_ids, response_ids, finished) or per failed step ({"step", "error"}), rewound with
# metrics.jsonl on a resume.
RL = "rl"
RL_POLICY = f"{RL}/policy"
RL_DRAFT = f"{RL}/draft"
ROLLOUTS = f"{RL}/rollouts.jsonl"
# Folders ranks and executors write into: each must be a real folder inside the run folder, never a link.
WRITTEN_DIRS = (RESULTS, LOGS, SUBMITIT, ATTEMPTS, CHECKPOINTS, DRAFTS, TAPS, SERVE_CACHE, RL)
STEP_RE = re.compile(r"^step-(\d{1,12})$")

MAX_PLAN_BYTES = 256 * 2**20  # a 131,072-GPU plan is about 25 MB; anything far larger is not a plan
MAX_RECORD_BYTES = 1 << 20  # a record with a thousand attempts is about 300 KB
MAX_RESULT_BYTES = 1 << 20  # a result line holds checks and a traceback tail: a few KB
MAX_METRICS_BYTES = 64 << 20  # the newest 64 MiB of metrics.jsonl: about 200,000 steps
MAX_ROLLOUTS_BYTES = 256 << 20  # the newest 256 MiB of rollouts.jsonl: its samples carry their text
MAX_MARKER_BYTES = 64 << 20  # the manifest lists every shard file: a few hundred bytes per rank
MAX_DCP_METADATA_BYTES = 1 << 30  # torch DCP's .metadata: about 1 KB per tensor shard
# `status` and the launcher check the content hashes of a checkpoint up to this size (a read of every byte); a larger
# one they check by its sizes, and export and the ranks that load it check in full.
HASH_CHECK_BYTES = 8 << 30
MAX_STEP = 10**12  # a step count far past any run (the marker and metrics are bounded by it)

# A rank's exit code after it saved a checkpoint and stopped on request (EX_TEMPFAIL, sysexits.h): the runtime exits
# with it, the launchers and `specdraft launch` read it. Run it again with --resume.
PREEMPTED_EXIT = 75
USER_ERROR_EXIT = 2  # a refused resume or data file: the user's to fix, said in one line


class LinkOut(UserError):
    """A path inside a run folder (or a checkpoint) that is a link, passes through one, or resolves outside it."""


def link_note(path: Path) -> str:
    return f"{path} is a symbolic link; specdraft follows no link inside a run folder"


def result_name(rank: int) -> str:
    return f"{RESULTS}/rank-{rank:05d}.json"


def step_name(step: int) -> str:
    return f"step-{step}"


def local_logs(rank: int) -> tuple[str, str]:
    """(stdout, stderr) of a local rank, relative to the run folder."""
    return f"{LOGS}/rank-{rank}.out", f"{LOGS}/rank-{rank}.err"


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def contained(root: str | os.PathLike, path: str | os.PathLike, what: str = "path") -> Path:
    """``path`` (absolute, or relative to ``root``) resolved, if it lies inside ``root`` and reaches it without a
    symbolic link below ``root``; LinkOut naming it otherwise. What does not exist yet is not a link.

    A link is refused even when it points back inside: it could be repointed between a check and a use."""
    given = Path(path) if Path(path).is_absolute() else Path(root) / path
    if ".." in Path(path).parts:
        raise LinkOut(f"{what} {given} climbs with '..'", "name the path inside the folder directly")
    base = os.path.abspath(root)
    rel = os.path.relpath(os.path.abspath(given), base)
    if rel == ".." or rel.startswith(".." + os.sep):
        raise LinkOut(f"{what} {given} is outside {base}", "name a path inside the folder")
    probe = Path(base)
    for part in Path(rel).parts:
        if part == ".":
            continue
        probe = probe / part
        try:
            mode = os.lstat(probe).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break
        if stat.S_ISLNK(mode):
            raise LinkOut(
                f"{what} {given}: {probe} is a symbolic link; specdraft follows no link inside a run folder or "
                "checkpoint",
                "remove the link (specdraft never creates one there)",
            )
    resolved = given.resolve()
    if not resolved.is_relative_to(Path(base).resolve()):
        raise LinkOut(
            f"{what} {given} resolves to {resolved}, outside {base}; specdraft follows nothing out of a run folder",
            "remove the link (specdraft never creates one there)",
        )
    return resolved


@dataclass(frozen=True, init=False)
class RunPaths:
    """One run folder and every name in it. The properties are plain paths; `inside` resolves one and checks it
    stays in the folder without passing a link; `step_dirs` lists the checkpoints the way every command sees them."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(os.path.abspath(root)))

    def __truediv__(self, rel: str) -> Path:
        return self.root / rel

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    @property
    def record(self) -> Path:
        return self.root / RECORD

    @property
    def marker(self) -> Path:
        return self.root / RUN_MARKER

    @property
    def sbatch(self) -> Path:
        return self.root / SBATCH

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def submitit(self) -> Path:
        return self.root / SUBMITIT

    @property
    def attempts(self) -> Path:
        return self.root / ATTEMPTS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def drafts(self) -> Path:
        return self.root / DRAFTS

    @property
    def taps(self) -> Path:
        return self.root / TAPS

    @property
    def requeue_request(self) -> Path:
        return self.root / REQUEUE_REQUEST

    @property
    def serve_cache(self) -> Path:
        return self.root / SERVE_CACHE

    @property
    def rl(self) -> Path:
        return self.root / RL

    @property
    def rl_policy(self) -> Path:
        return self.root / RL_POLICY

    @property
    def rl_draft(self) -> Path:
        return self.root / RL_DRAFT

    @property
    def rollouts(self) -> Path:
        return self.root / ROLLOUTS

    def result(self, rank: int) -> Path:
        return self.root / result_name(rank)

    def attempt(self, n: int) -> Path:
        return self.attempts / str(n)

    def step(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    def published(self, step: int) -> Path:
        return self.drafts / step_name(step)

    def inside(self, path: str | os.PathLike, what: str = "path") -> Path:
        """``path`` resolved, if it stays in the run folder without a link below it; LinkOut otherwise."""
        return contained(self.root, path, what)

    def real_dir(self, rel: str) -> Path:
        """RUN/rel checked to be a real folder (or absent) inside the run folder: what a writer may create."""
        path = self.root / rel
        self.inside(path, rel)
        if _lexists(path) and not path.is_dir():
            raise LinkOut(f"{path} is not a folder", "remove it (specdraft never creates a file there)")
        return path

    def step_dirs(self, links: list[Path] | None = None) -> list[tuple[int, Path]]:
        """(step, folder) of every real step-N folder under checkpoints/, newest first, complete or not. A link
        (to a folder or anything else) is never listed; each one goes into ``links`` when given."""
        root = self.checkpoints
        if not _lexists(root):
            return []
        self.inside(root, CHECKPOINTS)
        if not root.is_dir():
            return []
        found = []
        for entry in os.scandir(root):
            m = STEP_RE.match(entry.name)
            if not m:
                continue
            if entry.is_symlink():
                if links is not None:
                    links.append(root / entry.name)
            elif entry.is_dir(follow_symlinks=False):
                found.append((int(m.group(1)), root / entry.name))
        return sorted(found, reverse=True)

    def is_own_checkpoint(self, folder: str | os.PathLike) -> bool:
        """True when ``folder`` (through any alias: a link to the run folder, '..', a relative path) lies in
        this run folder's checkpoints/."""
        mine = self.checkpoints.resolve()
        return Path(folder).resolve().is_relative_to(mine)
