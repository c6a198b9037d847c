"""Checkpoint folders on disk (no torch), read by the runtime and the launcher alike: RUN_DIR/checkpoints/step-N/,
the completion marker that makes one count, which checkpoint a resume uses (and what it refuses), pruning, and
metrics.jsonl rewritten to a checkpoint.

`step-N` holds the state after N completed steps (the resumed run's first step has index N). The marker,
`specdraft-checkpoint.json`, is written atomically by rank 0 after every rank finished writing; it records the
layout, the model shape, the spec sha256 and a manifest (relative path -> size) of every file, so a truncated or
missing file is caught before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Callable

from specdraft.errors import SpecdraftError
from specdraft.fsutil import atomic_write_text, read_regular_text
from specdraft.plan.model import LaunchPlan

CHECKPOINTS_DIR = "checkpoints"
MARKER = "specdraft-checkpoint.json"
METRICS = "metrics.jsonl"  # the run's metrics rows 0..N-1, as they were when step-N was saved
FORMAT_VERSION = 1
STEP_RE = re.compile(r"^step-(\d+)$")
MAX_MARKER_BYTES = 64 << 20  # the manifest lists every shard file: a few hundred bytes per rank
# A rank's exit code after it saved a checkpoint and stopped on request (EX_TEMPFAIL, sysexits.h): the runtime exits
# with it, the launchers and `specdraft launch` read it. Run it again with --resume.
PREEMPTED_EXIT = 75


class ResumeError(SpecdraftError):
    """A resume that cannot go ahead: no checkpoint, another run's checkpoint, or another model shape."""


class CorruptCheckpoint(Exception):
    """A step folder that does not count: no marker (half-written), an unreadable marker, or a file that differs
    from the marker's manifest."""


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_root(run_dir) / f"step-{step}"


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every step-N folder under ``root``, newest first; complete or not."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


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
    """The draft's shape as a checkpoint must match it (the rest of the draft's shape is the target's)."""
    return {
        "enabled": plan.draft.enabled,
        "num_layers": plan.spec.draft.num_layers,
        "aux_layers": list(plan.draft.aux_layers),
    }


def write_marker(folder: Path, meta: dict) -> Path:
    """Rank 0, after every rank wrote its shards: the manifest of the folder plus ``meta``, atomically."""
    manifest = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER and not p.name.startswith(f".{MARKER}.")
    }
    record = {"format": FORMAT_VERSION, **meta, "manifest": manifest}
    return atomic_write_text(folder / MARKER, json.dumps(record, indent=1, sort_keys=True) + "\n")


def parse_marker(text: str) -> dict:
    """A marker's text -> its record; CorruptCheckpoint when it is not a complete specdraft marker."""
    try:
        meta = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise CorruptCheckpoint(f"its marker {MARKER} is unreadable ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CorruptCheckpoint(f"its marker is not a format-{FORMAT_VERSION} specdraft checkpoint marker")
    for key in ("step", "spec_sha256", "model", "parallel", "draft", "world_size", "manifest"):
        if key not in meta:
            raise CorruptCheckpoint(f"its marker lacks {key!r}")
    if not isinstance(meta["step"], int) or not isinstance(meta["manifest"], dict):
        raise CorruptCheckpoint("its marker's step or manifest has the wrong type")
    return meta


def check_manifest(meta: dict, size_of: Callable[[str], int | None]) -> None:
    """Every file the marker lists exists with the size it lists (``size_of(rel)``: None when missing)."""
    for rel, size in meta["manifest"].items():
        got = size_of(rel)
        if got is None:
            raise CorruptCheckpoint(f"{rel} is missing")
        if got != size:
            raise CorruptCheckpoint(f"{rel} has {got} bytes, the marker says {size}")


def read_marker(folder: Path) -> dict:
    """The marker of a complete checkpoint; CorruptCheckpoint (with the reason) for anything else. The marker is
    read bounded and non-blocking (a FIFO or device in its place is refused, never waited on)."""
    marker = folder / MARKER
    if not marker.is_file():
        raise CorruptCheckpoint("it has no completion marker (half-written: the run stopped while saving it)")
    try:
        text = read_regular_text(marker, MAX_MARKER_BYTES, "checkpoint marker")
    except SpecdraftError as err:
        raise CorruptCheckpoint(f"its marker {MARKER} is unreadable ({err})") from None
    meta = parse_marker(text)

    def size_of(rel: str) -> int | None:
        path = folder / rel
        return path.stat().st_size if path.is_file() else None

    check_manifest(meta, size_of)
    return meta


def complete_checkpoints(run_dir: Path, warn: Callable[[str], None]) -> list[tuple[Path, dict]]:
    """Complete checkpoints of the run folder, newest first. A folder that does not count and is newer than the
    newest complete one is reported through ``warn`` (older leftovers are pruning's business)."""
    out = []
    for _, folder in step_dirs(checkpoints_root(run_dir)):
        try:
            out.append((folder, read_marker(folder)))
        except CorruptCheckpoint as why:
            if not out:
                warn(f"skipping checkpoint {folder}: {why}")
    return out


def check_compatible(meta: dict, plan: LaunchPlan, folder: Path) -> None:
    """Refuse a checkpoint of another model (or draft) shape, naming every field that differs."""
    mine = describe(plan)
    diffs = [
        f"model.{k}: checkpoint {meta['model'].get(k)!r}, this plan {v!r}"
        for k, v in mine["model"].items()
        if meta["model"].get(k) != v
    ]
    diffs += [
        f"draft.{k}: checkpoint {meta['draft'].get(k)!r}, this plan {v!r}"
        for k, v in mine["draft"].items()
        if meta["draft"].get(k) != v
    ]
    if diffs:
        raise ResumeError(
            f"checkpoint {folder} holds another model shape than this plan's, so it cannot be loaded: "
            + "; ".join(diffs)
            + ". Resume from a checkpoint of this model, or start without "
            "--resume/--resume-from"
        )


def same_layout(meta: dict, plan: LaunchPlan) -> bool:
    """Saved under this very layout: then per-rank state (RNG streams) carries over rank for rank."""
    mine = describe(plan)
    return meta["parallel"] == mine["parallel"] and meta["world_size"] == mine["world_size"]


def choose(
    run_dir: Path, plan: LaunchPlan, mode: str, resume_from: Path | None, warn: Callable[[str], None]
) -> list[tuple[Path, dict]]:
    """The checkpoints a resume may load, best first (a later one is used only if an earlier one fails to load).

    ``mode`` "newest" (--resume): complete checkpoints of this run folder, which must be of this spec;
    "from" (--resume-from): exactly ``resume_from``, any spec of the same model shape;
    "auto" (a job Slurm restarted): like "newest"; with none at all, ``resume_from`` when the job was launched
    with --resume-from (it has not saved one of its own yet), else nothing (start from step 0).
    """
    found = [] if mode == "from" else complete_checkpoints(run_dir, warn)
    if mode == "from" or (mode == "auto" and not found and resume_from is not None):
        if resume_from is None:
            raise ResumeError('resume mode "from" needs a checkpoint folder (--resume-from)')
        folder = Path(resume_from).absolute()
        if not folder.is_dir():
            raise ResumeError(f"--resume-from {folder}: no such checkpoint folder")
        try:
            meta = read_marker(folder)
        except CorruptCheckpoint as why:
            raise ResumeError(f"--resume-from {folder} is not a complete checkpoint: {why}") from None
        check_compatible(meta, plan, folder)
        return [(folder, meta)]
    if not found:
        if mode == "auto":
            return []
        raise ResumeError(
            f"--resume: there is no complete checkpoint in {checkpoints_root(run_dir)} to resume "
            "from; run without --resume to start from step 0 (and set training.save_interval so "
            "checkpoints are written)"
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
    than the newest complete one. The marker goes first, so a folder half-deleted by a crash never counts."""
    removed = []
    complete = 0
    for _, folder in step_dirs(checkpoints_root(run_dir)):
        is_complete = (folder / MARKER).is_file()
        if is_complete and complete < keep:
            complete += 1
            continue
        if not is_complete and complete == 0:
            continue  # newer than every complete checkpoint: being written, or evidence for the next resume
        remove(folder)
        removed.append(folder)
    return removed


def remove(folder: Path) -> None:
    """Delete a step folder: its marker first (it stops counting at once), then the rest."""
    (folder / MARKER).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=False)


def metrics_rows(path: Path, steps: int) -> list[str]:
    """The lines of metrics.jsonl for steps 0..steps-1, once each and in order; a torn or foreign line is dropped."""
    if not path.is_file():
        return []
    rows: dict[int, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue  # a line cut short by a kill
        if isinstance(step, int) and 0 <= step < steps:
            rows[step] = line
    return [rows[s] for s in sorted(rows)]


def rewrite_metrics(run_dir: Path, lines: list[str]) -> None:
    """metrics.jsonl becomes exactly ``lines`` (atomically): no step of the abandoned future survives a resume."""
    atomic_write_text(Path(run_dir) / "metrics.jsonl", "".join(line + "\n" for line in lines))
