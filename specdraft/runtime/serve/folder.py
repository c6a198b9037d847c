"""Export folders that appear whole: files are written into a temp folder beside the target, fsynced, recorded in
the provenance marker (with each file's sha256), then moved in with one rename. An earlier specdraft export there
is replaced (moved aside first, deleted after); anything else there is refused (offline.check_export_target)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from specdraft.runtime.serve.offline import EXPORT_MARKER, check_export_target


def write_folder(folder: Path, fill: Callable[[Path], None], record: dict) -> Path:
    """``fill(tmp)`` writes the export's files into ``tmp``; ``record`` plus the files' sha256 becomes the marker."""
    folder = Path(folder).absolute()
    folder.parent.mkdir(parents=True, exist_ok=True)
    check_export_target(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name[:100]}.", suffix=".tmp", dir=folder.parent))
    try:
        fill(tmp)
        for path in tmp.iterdir():
            fsync_file(path)
        record = {**record, "files": {p.name: sha256(p) for p in sorted(tmp.iterdir())}}
        write_text(tmp / EXPORT_MARKER, json.dumps(record, indent=1, sort_keys=True) + "\n")
        fsync_dir(tmp)
        old = None
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name[:100]}.", suffix=".old", dir=folder.parent))
            os.rename(folder, old / "export")
        os.rename(tmp, folder)
        fsync_dir(folder.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
