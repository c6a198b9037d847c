"""The checkpoint marker, specdraft-checkpoint.json, read as untrusted (every field checked by type and range), and
its manifest: each file of the checkpoint (a plain name) -> size and sha256, so damage is caught and named.
Rank 0 writes it atomically and last, after every rank hashed its share (runtime/train/checkpoint.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Iterable

from specdraft.errors import SpecdraftError
from specdraft.fsutil import atomic_write_text
from specdraft.runs import files as runfiles
from specdraft.runs.paths import CHECKPOINT_MARKER, MAX_MARKER_BYTES, MAX_STEP, MAX_WORLD_SIZE, STEP_RE

MARKER = CHECKPOINT_MARKER
FORMAT_VERSION = 2  # 2: the manifest carries sha256 per file; 1 (sizes only) is refused as another version's
MAX_FILE_BYTES = 1 << 50  # one checkpoint file (1 PiB): a size past it is not a file size
MAX_FILES = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The checkpoint's own layout (torch DCP's torch_dist format): plain file names in the step folder itself.
_FILE_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,254}")
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,300}")
HASH_CHUNK = 4 << 20


class CorruptCheckpoint(Exception):
    """A step folder that does not count: no marker (half-written), a marker that is not a valid one, a link, or a
    file that differs from the marker's manifest. The message says which and names the file."""


def check_name(rel: object) -> str:
    """A manifest entry: a plain file name of the checkpoint folder (no folder, no '..', not absolute)."""
    if not isinstance(rel, str) or not _FILE_NAME.fullmatch(rel) or rel in (".", ".."):
        raise CorruptCheckpoint(
            f"its marker's manifest names {str(rel)[:80]!r}, which is not a file of the checkpoint folder itself "
            "(a manifest lists plain file names: no folder, no '..', no absolute path)"
        )
    return rel


def manifest_files(folder: Path) -> list[str]:
    """Every file of a checkpoint folder but the marker (and its temp files), sorted; a link or a sub-folder is
    refused by name (specdraft's checkpoints hold neither)."""
    names = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name == MARKER or entry.name.startswith(f".{MARKER}."):
            continue
        mode = entry.stat(follow_symlinks=False).st_mode
        if not stat.S_ISREG(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise CorruptCheckpoint(f"{folder / entry.name} is {what}; a checkpoint folder holds only its own files")
        names.append(check_name(entry.name))
    return names


def hash_file(folder: Path, rel: str) -> dict:
    """{"size", "sha256"} of folder/rel, opened without following a link (runs.files)."""
    try:
        fd = runfiles.open_file(folder, rel, os.O_RDONLY)
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{rel} is missing") from None
    except SpecdraftError as err:
        raise CorruptCheckpoint(str(err)) from None
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def hash_files(folder: Path, rels: Iterable[str]) -> dict[str, dict]:
    return {rel: hash_file(Path(folder), rel) for rel in rels}


def write_marker(folder: Path, meta: dict, manifest: dict[str, dict] | None = None) -> Path:
    """Rank 0, after every file was written and hashed: the manifest (default: every file, hashed here) plus
    ``meta``, atomically."""
    if manifest is None:
        manifest = hash_files(Path(folder), manifest_files(Path(folder)))
    record = {"format": FORMAT_VERSION, **meta, "manifest": dict(sorted(manifest.items()))}
    return atomic_write_text(Path(folder) / MARKER, json.dumps(record, indent=1, sort_keys=True) + "\n")


def _int(meta: dict, key: str, low: int, high: int) -> None:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise CorruptCheckpoint(f"its marker's {key} is {str(value)[:40]!r}, not an integer in {low}..{high:,}")


def _check_loss_scale(value: Any) -> None:
    if value is None:
        return
    ok = (
        isinstance(value, dict)
        and isinstance(value.get("scale"), (int, float))
        and not isinstance(value.get("scale"), bool)
        and 0 < value["scale"] < 2.0**128
    )
    for key in ("growth_tracker", "hysteresis_tracker"):
        ok = ok and isinstance(value.get(key), int) and not isinstance(value.get(key), bool) and 0 <= value[key] < 2**31
    if not ok:
        raise CorruptCheckpoint(
            "its marker's loss_scale is not {scale: a positive number, growth_tracker and hysteresis_tracker: counts}"
        )


def _check_data(value: Any) -> None:
    """A data file's position ({epoch, index, digest, sha256}: runtime/train/packing.py; older checkpoints lack
    sha256, the file's own hash), or null for the built-in data."""
    if value is None:
        return
    ok = isinstance(value, dict) and set(value) - {"sha256"} == {"epoch", "index", "digest"}
    ok = ok and all(isinstance(value[k], int) and not isinstance(value[k], bool) for k in ("epoch", "index"))
    ok = ok and 0 <= value["epoch"] <= MAX_STEP and 0 <= value["index"] <= MAX_STEP
    hashes = [value.get(k, "0" * 64) for k in ("digest", "sha256")] if ok else []
    if not ok or not all(isinstance(h, str) and _SHA256.fullmatch(h) for h in hashes):
        raise CorruptCheckpoint("its marker's data is not {epoch, index: counts, digest, sha256: sha256s} or null")


def _check_manifest(manifest: Any) -> None:
    if not isinstance(manifest, dict) or not 0 < len(manifest) <= MAX_FILES:
        raise CorruptCheckpoint("its marker's manifest is not an object listing the checkpoint's files")
    for rel, entry in manifest.items():
        check_name(rel)
        if (
            not isinstance(entry, dict)
            or set(entry) != {"size", "sha256"}
            or not isinstance(entry["size"], int)
            or isinstance(entry["size"], bool)
            or not 0 <= entry["size"] <= MAX_FILE_BYTES
            or not isinstance(entry["sha256"], str)
            or not _SHA256.fullmatch(entry["sha256"])
        ):
            raise CorruptCheckpoint(f"its marker's manifest entry for {rel} is not {{size: bytes, sha256: hex}}")


def parse_marker(text: str, folder: Path | None = None) -> dict:
    """A marker's text -> its record, every field checked; CorruptCheckpoint naming the first field that is wrong.
    In a step-N folder the marker must say step N."""
    try:
        meta = runfiles.parse_json(text, MARKER)
    except runfiles.BadRunFile as err:
        raise CorruptCheckpoint(f"its marker {err.message}") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(
            f"its marker holds {type(meta).__name__} {meta!r:.40}, not a specdraft checkpoint marker"
        )
    version = meta.get("format")
    if version != FORMAT_VERSION:
        raise CorruptCheckpoint(
            f"its marker is format {str(version)[:20]}, this specdraft reads format {FORMAT_VERSION}: it was "
            f"written by another specdraft version (specdraft {str(meta.get('specdraft_version'))[:40]}); use "
            "that version to resume or export it"
        )
    for key in ("step", "spec_sha256", "model", "parallel", "draft", "world_size", "manifest"):
        if key not in meta:
            raise CorruptCheckpoint(f"its marker lacks {key!r}")
    _int(meta, "step", 0, MAX_STEP)
    _int(meta, "world_size", 1, MAX_WORLD_SIZE)
    for key in ("target_optimizer_step", "draft_optimizer_step"):
        _int(meta, key, 0, MAX_STEP)
    if not isinstance(meta["spec_sha256"], str) or not _SHA256.fullmatch(meta["spec_sha256"]):
        raise CorruptCheckpoint("its marker's spec_sha256 is not a sha256 (64 hex digits)")
    for key in ("name", "specdraft_version"):
        if not isinstance(meta.get(key), str) or not _TEXT.fullmatch(meta[key]):
            raise CorruptCheckpoint(f"its marker's {key} is not a line of text")
    for key in ("model", "parallel", "draft"):
        if not isinstance(meta[key], dict):
            raise CorruptCheckpoint(
                f"its marker's {key} is {type(meta[key]).__name__} {meta[key]!r:.40}, not an object"
            )
    if not isinstance(meta.get("main_weights"), bool):
        raise CorruptCheckpoint("its marker's main_weights is not true or false")
    _check_loss_scale(meta.get("loss_scale"))
    _check_data(meta.get("data"))
    _check_manifest(meta["manifest"])
    name = Path(folder).name if folder is not None else ""
    named = STEP_RE.match(name)
    if named and int(named.group(1)) != meta["step"]:
        raise CorruptCheckpoint(f"its marker says step {meta['step']}, but the folder is {name}")
    return meta


def check_sizes(meta: dict, size_of: Callable[[str], int | None]) -> None:
    """Every file the marker lists exists with the size it lists (``size_of(rel)``: None when missing)."""
    for rel, entry in meta["manifest"].items():
        got = size_of(rel)
        if got is None:
            raise CorruptCheckpoint(f"{rel} is missing")
        if got != entry["size"]:
            raise CorruptCheckpoint(f"{rel} has {got} bytes, the marker says {entry['size']}")


def check_hashes(folder: Path, meta: dict, rels: Iterable[str] | None = None) -> None:
    """The files ``rels`` (default: all) hash to what the manifest records; CorruptCheckpoint naming the first
    damaged one."""
    manifest = meta["manifest"]
    for rel in manifest if rels is None else rels:
        got = hash_file(Path(folder), rel)
        if got["size"] != manifest[rel]["size"]:
            raise CorruptCheckpoint(f"{rel} has {got['size']} bytes, the marker says {manifest[rel]['size']}")
        if got["sha256"] != manifest[rel]["sha256"]:
            raise CorruptCheckpoint(
                f"{Path(folder) / rel} is damaged: its content hash (sha256 {got['sha256'][:12]}...) differs from "
                f"the one recorded when it was saved ({manifest[rel]['sha256'][:12]}...)"
            )


def read_marker(folder: Path) -> dict:
    """The checked marker of ``folder``, read bounded and without following a link; CorruptCheckpoint otherwise."""
    try:
        text = runfiles.read_text(folder, MARKER, MAX_MARKER_BYTES)
    except SpecdraftError as err:
        raise CorruptCheckpoint(f"its marker {MARKER} is unreadable ({err})") from None
    except OSError as err:
        raise CorruptCheckpoint(f"its marker {MARKER} is unreadable ({err.strerror or err})") from None
    if text is None:
        raise CorruptCheckpoint("it has no completion marker (half-written: the run stopped while saving it)")
    return parse_marker(text, folder)
