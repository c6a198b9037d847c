"""Real filesystems for the failures a disk causes: a read-only folder and a tiny one that fills up.

As root (this sandbox, CI's container) a folder's mode does not stop a write, so a read-only folder is a read-only
tmpfs mounted there, and a full disk is a small tmpfs; a test that cannot mount one is skipped, never faked.

    with read_only_dir(tmp_path / "ro") as folder: ...         # EACCES (non-root, mode 0555) or EROFS (root)
    with small_filesystem(tmp_path / "disk", "1m") as folder:  # ENOSPC once it holds about 1 MiB
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# Longer than NAME_MAX (255) and than PATH_MAX (4,096): what a user may type, what no filesystem takes.
LONG_NAME = "n" * 300
LONG_PATH_PARTS = ["d" * 200] * 25


def long_path(base: Path) -> Path:
    return base.joinpath(*LONG_PATH_PARTS)


def _mount(folder: Path, options: str) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30, check=False)


@contextlib.contextmanager
def small_filesystem(folder: Path, size: str = "1m"):
    """``folder`` as a tmpfs of ``size`` bytes (mount's syntax: 512k, 2m), unmounted after."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount(folder, f"size={size},mode=0755")
    try:
        yield folder
    finally:
        _umount(folder)


@contextlib.contextmanager
def read_only_dir(folder: Path):
    """``folder`` that nobody may write into: mode 0555 for a user, a read-only tmpfs for root."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
        return
    _mount(folder, "ro,size=64k")
    try:
        yield folder
    finally:
        _umount(folder)
