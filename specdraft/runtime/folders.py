"""The folders the runtime's tools write, and the errors of reading a run or writing a folder: exports appear whole
(files written into a temp folder beside the target, fsynced, recorded in the provenance marker with each file's
sha256, then moved in with one rename); an earlier specdraft export there is replaced, anything else is refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

from specdraft.errors import SpecdraftError, file_error
from specdraft.fsutil import make_temp_dir, umask_mode

EXPORT_MARKER = "specdraft-export.json"  # an export's provenance file; also what makes a folder safe to replace


class LoadError(SpecdraftError):
    """A run folder or checkpoint that cannot give what was asked (the user's to fix: exit 2)."""

    def __init__(self, message: str, fix: str = ""):
        self.message, self.fix = message, fix
        super().__init__(message)


class ExportError(LoadError):
    """A draft or an output folder the EAGLE-3 export cannot take (more than one decoder layer, a foreign folder)."""


def check_export_target(folder: Path) -> None:
    """An export replaces an earlier specdraft export or fills an empty folder; anything else there is refused."""
    folder = Path(folder)
    empty = folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())
    if folder.exists() and not (folder / EXPORT_MARKER).is_file() and not empty:
        raise ExportError(
            f"{folder} exists and is not a specdraft export; refusing to replace it",
            "pick another -o folder (an earlier specdraft export there is replaced)",
        )


def write_folder(folder: Path, fill: Callable[[Path], None], record: dict) -> Path:
    """``fill(tmp)`` writes the export's files into ``tmp``; ``record`` plus the files' sha256 becomes the marker.
    What a user or a filesystem causes (a read-only folder, a full disk, a name too long) is a FileError naming
    ``folder``."""
    folder = Path(folder).absolute()
    try:
        return _write_folder(folder, fill, record)
    except OSError as err:
        user = file_error(err, folder, "write the export")
        if user is None:
            raise
        raise user from None


def save_safetensors(named: dict, path: Path) -> None:
    """safetensors' save_file, whose I/O errors (a Rust SafetensorError) become the OSError they report."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(named, str(path), metadata={"format": "pt"})
    except SafetensorError as err:
        found = re.search(r"\(os error (\d+)\)", str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


def _write_folder(folder: Path, fill: Callable[[Path], None], record: dict) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    check_export_target(folder)
    # The folder and its files get what the umask allows, like any the user creates: the serving job of a colleague
    # or a group reads the export it is meant to load (mkdtemp's 0o700 and safetensors' 0o600 would keep it out).
    tmp = make_temp_dir(folder.parent, f".{folder.name[:100]}.", ".tmp")
    try:
        fill(tmp)
        for path in tmp.iterdir():
            os.chmod(path, umask_mode(0o666))
            fsync_file(path)
        record = {**record, "files": {p.name: sha256(p) for p in sorted(tmp.iterdir())}}
        write_text(tmp / EXPORT_MARKER, json.dumps(record, indent=1, sort_keys=True) + "\n")
        fsync_dir(tmp)
        old = None
        if folder.exists():
            old = make_temp_dir(folder.parent, f".{folder.name[:100]}.", ".old")
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
