"""Checkpoint folders (no torch), for the runtime and the launcher alike: RUN_DIR/checkpoints/step-N/ (the state after
N steps), what makes one count, which one a resume uses and what it refuses, pruning, metrics.jsonl rewritten to
one. It counts when its marker is valid (runs/marker.py), its files whole, none a link, its metadata safe."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from specdraft.errors import SpecdraftError, echo
from specdraft.fsutil import atomic_write_text, current_umask
from specdraft.plan.model import LaunchPlan
from specdraft.runs import files as runfiles
from specdraft.runs.dcp import DCP_METADATA, check_metadata
from specdraft.runs.marker import (
    MARKER,
    CorruptCheckpoint,
    check_hashes,
    check_sizes,
    hash_files,
    manifest_files,
    read_marker,
    write_marker,
)
from specdraft.runs.paths import (
    CHECKPOINTS,
    MAX_DCP_METADATA_BYTES,
    METRICS,
    RL,
    ROLLOUTS,
    STEP_RE,
    RunPaths,
    contained,
    link_note,
)

__all__ = ["MARKER", "METRICS", "CorruptCheckpoint", "ResumeError", "check_hashes", "write_marker", "hash_files"]
MAX_METRICS_LINE = 1 << 20  # a metrics row is a few hundred bytes; a longer line is not one of ours
MAX_ROLLOUT_LINE = 64 << 20  # a rollouts.jsonl row carries one sample's text, or (older runs) a whole step's ids
ALLOW_DATA_CHANGE = "--allow-data-change"


class ResumeError(SpecdraftError):
    """A resume that cannot go ahead: no checkpoint, another run's checkpoint, another model shape, nothing left."""


def checkpoints_root(run_dir: Path) -> Path:
    return RunPaths(run_dir).checkpoints


def step_dir(run_dir: Path, step: int) -> Path:
    return RunPaths(run_dir).step(step)


def describe(plan: LaunchPlan) -> dict:
    """What a checkpoint records about the run that wrote it (JSON-ready)."""
    return json.loads(
        json.dumps(
            {
                "name": plan.name,
                "spec_sha256": plan.spec_sha256,
                "specdraft_version": plan.specdraft_version,
                "world_size": plan.world_size,
                "parallel": dataclasses.asdict(plan.parallel),
                "model": dataclasses.asdict(plan.model),
                "draft": draft_fields(plan),
            }
        )
    )


def draft_fields(plan: LaunchPlan) -> dict:
    """The draft's shape as a checkpoint must match it (the rest of the draft's shape is the target's): its layers,
    the taps it fuses and its LM head's vocabulary."""
    return {
        "enabled": plan.draft.enabled,
        "num_layers": plan.draft.num_layers,
        "aux_layers": list(plan.draft.aux_layers),
        "vocab_size": plan.draft.vocab_size,
    }


def total_bytes(meta: dict) -> int:
    return sum(entry["size"] for entry in meta["manifest"].values())


def check_checkpoint(folder: Path, *, hash_limit: float = 0) -> dict:
    """The marker of ``folder`` when it is a complete, safe checkpoint (every file's sha256 too when the checkpoint
    holds at most ``hash_limit`` bytes: math.inf for always); CorruptCheckpoint saying why otherwise. Nothing below
    ``folder`` is followed: a link is refused by name."""
    folder = Path(folder)
    meta = read_marker(folder)
    try:
        manifest_files(folder)
    except OSError as err:
        raise CorruptCheckpoint(f"it cannot be listed ({err.strerror or err})") from None
    check_sizes(meta, lambda rel: runfiles.size(folder, rel))
    if DCP_METADATA not in meta["manifest"]:
        raise CorruptCheckpoint(f"its manifest lists no {DCP_METADATA}: it is not a torch_dist checkpoint")
    try:
        data = runfiles.read_bytes(folder, DCP_METADATA, MAX_DCP_METADATA_BYTES)
    except SpecdraftError as err:
        raise CorruptCheckpoint(str(err)) from None
    if data is None:
        raise CorruptCheckpoint(f"{DCP_METADATA} is missing")
    check_metadata(data, str(folder / DCP_METADATA))
    if total_bytes(meta) <= hash_limit:
        check_hashes(folder, meta)
    return meta


def complete_checkpoints(run_dir: Path, warn: Callable[[str], None], hash_limit: float = 0) -> list[tuple[Path, dict]]:
    """Complete checkpoints of the run folder, newest first. A folder that does not count and is newer than the
    newest complete one, and any step-N that is a link, is reported through ``warn`` (older leftovers are
    pruning's business)."""
    links: list[Path] = []
    dirs = RunPaths(run_dir).step_dirs(links)
    for link in links:
        warn(f"skipping {link_note(link)}")
    out: list[tuple[Path, dict]] = []
    for _, folder in dirs:
        try:
            out.append((folder, check_checkpoint(folder, hash_limit=hash_limit if not out else 0)))
        except CorruptCheckpoint as why:
            if not out:
                warn(f"skipping checkpoint {folder}: {why}")
    return out


def shape_differences(meta: dict, plan: LaunchPlan) -> list[str]:
    """Every model and draft field on which the checkpoint and ``plan`` differ, as `part.field: a, b`."""
    mine = describe(plan)
    return [
        f"{part}.{k}: checkpoint {echo(meta[part].get(k), 80)}, this plan {echo(v, 80)}"
        for part in ("model", "draft")
        for k, v in mine[part].items()
        if meta[part].get(k) != v
    ]


def check_compatible(meta: dict, plan: LaunchPlan, folder: Path) -> None:
    """Refuse a checkpoint of another model (or draft) shape, naming every field that differs."""
    diffs = shape_differences(meta, plan)
    if diffs:
        raise ResumeError(
            f"checkpoint {folder} holds another model shape than this plan's, so it cannot be loaded: "
            + "; ".join(diffs)
            + ". Resume from a checkpoint of this model, or start without "
            "--resume/--resume-from"
        )


def check_steps(meta: dict, steps: int | None, folder: Path) -> None:
    """A checkpoint at or past the run's last step leaves nothing to train: refused, not reported COMPLETED."""
    if steps is not None and meta["step"] >= steps:
        raise ResumeError(
            f"--resume-from {folder} holds the state after step {meta['step']}, and this launch trains {steps} "
            f"steps (--steps, else training.train_iters): nothing is left to train. Give --steps above "
            f"{meta['step']} to train on from it"
        )


def same_layout(meta: dict, plan: LaunchPlan) -> bool:
    """Saved under this very layout: then per-rank state (RNG streams) carries over rank for rank."""
    mine = describe(plan)
    return meta["parallel"] == mine["parallel"] and meta["world_size"] == mine["world_size"]


def choose(
    run_dir: Path,
    plan: LaunchPlan,
    mode: str,
    resume_from: Path | None,
    warn: Callable[[str], None],
    steps: int | None = None,
    hash_limit: float = 0,
) -> list[tuple[Path, dict]]:
    """The checkpoints a resume may load, best first (a later one is used only if an earlier one fails to load).

    ``mode`` "newest" (--resume): complete checkpoints of this run folder, which must be of this spec;
    "from" (--resume-from): exactly ``resume_from``, any spec of the same model shape, before ``steps``;
    "auto" (a job Slurm restarted): like "newest"; with none at all, ``resume_from`` when the job was launched
    with --resume-from (it has not saved one of its own yet), else nothing (start from step 0).
    The first candidate's content hashes are checked here when it holds at most ``hash_limit`` bytes (the
    launcher's choice; the ranks check them in parallel before they load).
    """
    skipped: list[str] = []

    def note(message: str) -> None:
        skipped.append(message)
        warn(message)

    found = [] if mode == "from" else complete_checkpoints(run_dir, note, hash_limit)
    if mode == "from" or (mode == "auto" and not found and resume_from is not None):
        if resume_from is None:
            raise ResumeError('resume mode "from" needs a checkpoint folder (--resume-from)')
        folder = Path(resume_from).resolve()  # the path given is the user's; below it, nothing is followed
        if not folder.is_dir():
            raise ResumeError(f"--resume-from {folder}: no such checkpoint folder")
        try:
            meta = check_checkpoint(folder, hash_limit=hash_limit)
        except CorruptCheckpoint as why:
            raise ResumeError(f"--resume-from {folder} is not a complete checkpoint: {why}") from None
        check_compatible(meta, plan, folder)
        check_steps(meta, steps, folder)
        return [(folder, meta)]
    if not found:
        if mode == "auto":
            return []
        seen = f" ({'; '.join(skipped)[:2000]})" if skipped else ""
        raise ResumeError(
            f"--resume: there is no complete checkpoint in {checkpoints_root(run_dir)} to resume from{seen}; run "
            "without --resume to start from step 0 (and set training.save_interval so checkpoints are written)"
        )
    for folder, meta in found:
        if meta["spec_sha256"] != plan.spec_sha256:
            raise ResumeError(
                f"--resume: checkpoint {folder} was written by a run of another spec (spec sha256 "
                f"{meta['spec_sha256'][:12]}, this plan's is {plan.spec_sha256[:12]}); --resume continues only "
                f"the same run. To start this layout from it deliberately, use --resume-from {folder}"
            )
        check_compatible(meta, plan, folder)
    return found


def prune(run_dir: Path, keep: int) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints; drop older complete ones and stale incomplete folders older
    than the newest complete one. A link among them is never followed nor counted. The marker goes first, so a
    folder half-deleted by a crash never counts."""
    paths = RunPaths(run_dir)
    removed = []
    complete = 0
    for _, folder in paths.step_dirs():
        is_complete = runfiles.size(folder, MARKER) is not None
        if is_complete and complete < keep:
            complete += 1
            continue
        if not is_complete and complete == 0:
            continue  # newer than every complete checkpoint: being written, or evidence for the next resume
        remove(folder, paths)
        removed.append(folder)
    return removed


def remove(folder: Path, paths: RunPaths | None = None) -> None:
    """Delete a step folder of a run: its marker first (it stops counting at once), then the rest. A link in its
    place is removed itself, never what it points to; a folder outside the run's checkpoints/ is refused."""
    folder = Path(folder)
    paths = paths or RunPaths(folder.parent.parent)
    contained(paths.root, folder.parent, CHECKPOINTS)
    if folder.parent != paths.checkpoints or not STEP_RE.match(folder.name):
        raise ValueError(f"{folder} is not a step folder of {paths.checkpoints}")
    if folder.is_symlink():
        folder.unlink()
        return
    (folder / MARKER).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=False)


def metrics_rows(folder: Path, steps: int) -> list[str]:
    """The lines of ``folder``/metrics.jsonl (a run folder's or a checkpoint's) for steps 0..steps-1, once each and
    in order, read without following a link; a torn, foreign or oversized line is dropped."""
    try:
        fd = runfiles.open_file(folder, METRICS, os.O_RDONLY)
    except FileNotFoundError:
        return []
    rows: dict[int, str] = {}
    with os.fdopen(fd, "rb") as handle:
        while raw := handle.readline(MAX_METRICS_LINE + 1):
            if len(raw) > MAX_METRICS_LINE:
                while raw and not raw.endswith(b"\n"):  # the rest of an oversized line
                    raw = handle.readline(MAX_METRICS_LINE + 1)
                continue
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            try:
                row = runfiles.parse_json(line, METRICS)
            except runfiles.BadRunFile:
                continue  # a line cut short by a kill
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < steps:
                rows[step] = line
    return [rows[s] for s in sorted(rows)]


def write_metrics(folder: Path, lines: list[str]) -> Path:
    """``folder``/metrics.jsonl becomes exactly ``lines`` (atomically)."""
    return atomic_write_text(Path(folder) / METRICS, "".join(line + "\n" for line in lines))


def rewrite_metrics(run_dir: Path, lines: list[str]) -> None:
    """metrics.jsonl becomes exactly ``lines`` (atomically): no step of the abandoned future survives a resume."""
    write_metrics(RunPaths(run_dir).root, lines)


def data_change(saved: object, now: dict | None) -> tuple[str, str] | None:
    """(the checkpoint's hash, this data's hash) when a checkpoint written with a data file is resumed with a file
    of other content: the file's sha256 where both record it (older checkpoints do not), else the digest of its
    tokenised samples. None when they agree, or when either side has no data file."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return None
    for key in ("sha256", "digest"):
        then, here = saved.get(key), now.get(key)
        if isinstance(then, str) and isinstance(here, str):
            return None if then == here else (then, here)
    return None


def data_change_refused(path: str, folder: Path, hashes: tuple[str, str]) -> tuple[str, str]:
    """(message, fix) refusing a resume whose data file changed since ``folder`` was written: the file, both
    hashes shortened, the fix."""
    then, now = hashes
    return (
        f"data file {path} is not the file checkpoint {folder} was trained on (sha256 {then[:12]} then, {now[:12]} "
        "now): its data position does not apply, and the data would restart at its first sample",
        f"restore the file the run trained on, or launch again with {ALLOW_DATA_CHANGE} to train on the new file "
        "from its first sample",
    )


def rewind_rollouts(run_dir: Path, step: int) -> None:
    """RUN/rl/rollouts.jsonl keeps only its rows of steps before ``step`` (the step a resume continues at), as
    metrics.jsonl does: no step of the abandoned future is left twice. Both row formats carry "step" (one row per
    sample, or per step in older runs); a torn or foreign line is dropped. Streamed, then replaced atomically."""
    if not runfiles.is_dir(run_dir, RL):
        return
    try:
        fd = runfiles.open_file(run_dir, ROLLOUTS, os.O_RDONLY)
    except FileNotFoundError:
        return
    target = RunPaths(run_dir).rollouts
    out_fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "rb") as src, os.fdopen(out_fd, "wb") as dst:
            while raw := src.readline(MAX_ROLLOUT_LINE + 1):
                if len(raw) > MAX_ROLLOUT_LINE:
                    while raw and not raw.endswith(b"\n"):  # the rest of an oversized line
                        raw = src.readline(MAX_ROLLOUT_LINE + 1)
                    continue
                try:
                    row = runfiles.parse_json(raw, ROLLOUTS)
                except runfiles.BadRunFile:
                    continue  # a line cut short by a kill
                kept = row.get("step") if isinstance(row, dict) else None
                if isinstance(kept, int) and not isinstance(kept, bool) and 0 <= kept < step:
                    dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
