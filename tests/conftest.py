"""Shared pytest fixtures and hooks; each concern keeps to its own delimited section below."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache

import pytest

# ---------------------------------------------------------------------------------------------
# Real local Slurm cluster (scripts/local-slurm.sh): the `slurm` marker and the `slurm_cluster` fixture.
# Marked tests run when SPECDRAFT_SLURM is set (scripts/test.sh sets it after `up`, so a broken
# cluster fails them rather than skipping) or when `sinfo` already answers with idle nodes.
# ---------------------------------------------------------------------------------------------

SLURM_PARTITION = "debug"


@dataclass(frozen=True)
class SlurmCluster:
    partition: str
    num_nodes: int


@cache
def _probe_slurm() -> tuple[int, str]:
    """(idle-capable node count in the partition, why not usable); computed once per session."""
    if shutil.which("sinfo") is None:
        return 0, "`sinfo` is not installed"
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-p", SLURM_PARTITION, "-o", "%N %t"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 0, "`sinfo` did not answer within 15 s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return 0, f"`sinfo` failed: {last}"
    states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
    # "mix" nodes still have free CPUs; a trailing "*" means the node is not responding.
    usable = [name for name, state in states.items() if state in ("idle", "mix")]
    if not usable:
        return 0, f"no idle nodes in partition {SLURM_PARTITION!r} (sinfo: {states or 'empty'})"
    return len(states), ""


def _slurm_requested() -> bool:
    return os.environ.get("SPECDRAFT_SLURM", "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("slurm")]
    if not marked or _slurm_requested():
        return
    num_nodes, why = _probe_slurm()
    if num_nodes:
        return
    skip = pytest.mark.skip(
        reason=f"no local Slurm cluster ({why}); run `scripts/local-slurm.sh up` or scripts/test.sh as root"
    )
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    num_nodes, why = _probe_slurm()
    if not num_nodes:
        if _slurm_requested():  # the cluster was promised (CI), so its absence is a failure
            pytest.fail(f"SPECDRAFT_SLURM is set but the cluster is not usable: {why}")
        pytest.skip(f"no local Slurm cluster ({why})")
    return SlurmCluster(partition=SLURM_PARTITION, num_nodes=num_nodes)


# --------------------------------------- end of the Slurm section ----------------------------


# ---------------------------------------------------------------------------------------------
# Launch tests (tests/test_launch*.py, tests/test_sbatch*.py): run the real `specdraft` CLI in a
# subprocess, bounded, in a folder of the test's choosing.
# ---------------------------------------------------------------------------------------------

import sys  # noqa: E402 - this section's own imports
from pathlib import Path  # noqa: E402

SPECDRAFT_BIN = Path(sys.executable).with_name("specdraft")


@pytest.fixture
def specdraft_cli(tmp_path):
    """run(*args, cwd=tmp_path, env=None, timeout=120, text=True) -> CompletedProcess of `specdraft ARGS`."""

    def run(*args, cwd=None, env=None, timeout=120, text=True):
        full_env = {**os.environ, **(env or {})}
        full_env.pop("SPECDRAFT_DEBUG", None)  # the boundary's messages are what the tests read
        return subprocess.run(
            [str(SPECDRAFT_BIN), *map(str, args)],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=text,
            timeout=timeout,
            check=False,
        )

    return run


# --------------------------------------- end of the launch section ---------------------------


# ---------------------------------------------------------------------------------------------
# The CLI in this process (tests/support/cli.py) for tests not about the process itself: the same
# app and error boundary as `specdraft`, without an interpreter start per call.
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def specdraft_in_process(tmp_path):
    """run(*args, cwd=tmp_path, env=None) -> the exit code, stdout and stderr of `specdraft ARGS`, run here."""
    from tests.support.cli import run_cli

    def run(*args, cwd=None, env=None):
        return run_cli(*args, cwd=cwd or tmp_path, env=env)

    return run


# --------------------------------------- end of the in-process CLI section -------------------
