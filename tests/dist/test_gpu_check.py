"""The project's GPU check on CPU: `benchmarks/gpu_check.py --smoke` runs every part at a tiny shape (accuracy
against float64, the timing table, two real co-training launches of layouts/one-gpu.yaml and the plain step), so
the script cannot rot before a GPU runs it; and scripts/gpu-check.sh refuses bad arguments."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.paths import REPO

ROOT = REPO


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_gpu_check_smoke_runs_every_part():
    argv = [sys.executable, "benchmarks/gpu_check.py", "--smoke", "--reps", "2", "--steps", "2", "--skip", "1"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=550)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # (a): every float64 row is exact to rounding, both backends ran
    rows = re.findall(r"^\| float64 \| (\S+) \| (\S+) \| (\S+) \| (\S+) \| (\S+) \|", out, re.M)
    assert {r[0] for r in rows} == {"fused-cpu-flash", "reference"}, out
    assert all(float(x) < 1e-12 for r in rows for x in r[1:]), rows
    # (b): our kernel, the reference, the SDPA floor; Flex says why it cannot run on CPU
    assert re.search(r"^\| branch_attention \(auto: fused-cpu-flash\) \| \d", out, re.M), out
    assert re.search(r"^\| SDPA floor .*\| 1\.00 \|", out, re.M), out
    assert "FlexAttention, whole TTT mask | n/a: FlexAttention has no backward on CPU" in out
    # (c): both co-training launches finished and report their attention backends, beside the plain step
    assert "failed" not in out, out
    assert re.search(
        r"^\| specdraft, with draft \| [\d.]+ \| [\d,]+ \| [\d.]+% \| [\d.]+ \| target=fused-cpu-flash "
        r"draft=fused-cpu-flash \|",
        out,
        re.M,
    ), out
    assert re.search(r"^\| specdraft, no draft \| [\d.]+ .*\| target=fused-cpu-flash \|", out, re.M), out
    assert re.search(r"^draft overhead: [+-][\d.]+% step time", out, re.M), out


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "usage: scripts/gpu-check.sh WHEELS_DIR"),
        (["/nonexistent-wheels"], "is not a directory"),
        (["tests"], "no .whl files in 'tests'"),
    ],
)
def test_gpu_check_script_rejects_bad_wheels_dir(args, message):
    done = subprocess.run(["bash", "scripts/gpu-check.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and message in done.stderr, done.stderr
