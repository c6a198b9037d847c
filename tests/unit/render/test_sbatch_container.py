"""Container mode in the rendered script: goldens for both ways specdraft gets into the image, the mounts, --mem and
--requeue, and the batch script's requeue after srun run under bash with srun and scontrol replaced by stubs."""

from __future__ import annotations

import os
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.render.sbatch import render_sbatch
from specdraft.spec.load import builtin_layout_text, load_layout_text
from tests.support.paths import GOLDEN

PYTHON = "python"
PACKAGE = "/opt/specdraft-src/specdraft"
NGC = "nvcr.io#nvidia/nemo-rl:v0.4.0"
CONTAINER = [
    f"slurm.container_image={NGC}",
    "slurm.container_mounts=[/lustre/data:/data:ro]",
    "slurm.mem=200G",
    "cluster.num_nodes=2",
    "cluster.gpus_per_node=2",
]


def _plan(overrides=()):
    return compile(load_layout_text(builtin_layout_text("tiny-cpu"), list(overrides), source="tiny-cpu"))


@pytest.mark.parametrize("how", ["mount", "image"])
def test_golden_container_scripts(how):
    plan = _plan([*CONTAINER, f"slurm.container_specdraft={how}"])
    text = render_sbatch(plan, "/scratch/runs/c", python=PYTHON, package=PACKAGE).script
    text = text.replace(plan.plan_hash, "<plan-sha256>").replace(plan.plan_hash[:8], "<plan8>")
    text = text.replace(plan.spec_sha256, "<spec-sha256>")
    golden = GOLDEN / "sbatch" / f"container-{how}.sh"
    if os.environ.get("SPECDRAFT_REGEN_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"{golden} differs; SPECDRAFT_REGEN_GOLDEN=1 regenerates it"


def test_mount_mode_mounts_the_run_folder_and_the_package_and_says_so():
    plan = _plan([*CONTAINER, "slurm.container_specdraft=mount"])
    render = render_sbatch(plan, "/scratch/runs/c", python=PYTHON, package=PACKAGE)
    lines = render.script.splitlines()
    assert "#SBATCH --mem=200G" in lines and "#SBATCH --requeue" in lines
    assert any("specdraft gets in by mount (slurm.container_specdraft: mount)" in line for line in lines)
    srun = shlex.split(render.srun_line)
    assert f"--container-image={NGC}" in srun
    assert f"--container-mounts=/lustre/data:/data:ro,/scratch/runs/c:/scratch/runs/c,{PACKAGE}:{PACKAGE}:ro" in srun
    # The package's folder goes first on sys.path inside the one payload process (no PYTHONPATH, no wrapper).
    assert render.payload_argv[:3] == [PYTHON, "-u", "-c"] and render.payload_argv[4] == "/opt/specdraft-src"
    assert render.payload_argv[5:] == ["/scratch/runs/c/plan.json", "--workload", "cotrain"]
    image = render_sbatch(_plan([*CONTAINER, "slurm.container_specdraft=image"]), "/r", python=PYTHON)
    assert image.payload_argv[:4] == [PYTHON, "-u", "-m", "specdraft.runtime.entry"]
    assert "specdraft gets in with the image (slurm.container_specdraft: image)" in image.script
    assert "--container-mounts=/lustre/data:/data:ro,/r:/r" in image.srun_line and PACKAGE not in image.script


def test_host_mode_has_no_requeue_block_and_no_requeue_without_requeues():
    host = render_sbatch(_plan(["slurm.max_requeues=0"]), "/r", python=PYTHON)
    assert "#SBATCH --requeue" not in host.script and "--mem" not in host.script
    assert "requeue-request" not in host.script and host.script.rstrip().splitlines()[-1] == host.srun_line


def test_a_run_folder_a_mount_list_cannot_carry_is_refused():
    plan = _plan([*CONTAINER, "slurm.container_specdraft=image"])
    with pytest.raises(ValueError, match="run folder '/r/a,b' contains ',' or ':'"):
        render_sbatch(plan, "/r/a,b", python=PYTHON)


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


@pytest.mark.parametrize(
    "request_text, restart, requeued",
    [("4321 0", "0", True), ("4321 0", "1", False), ("999 0", "0", False), (None, "0", False)],
)
def test_the_batch_script_requeues_only_on_this_attempts_request(tmp_path, request_text, restart, requeued):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if request_text is not None:
        (run_dir / "requeue-request").write_text(request_text + "\n")
    plan = _plan([*CONTAINER, "slurm.container_specdraft=image"])
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(plan, str(run_dir), python=PYTHON).script)
    stubs, calls = tmp_path / "bin", tmp_path / "scontrol-calls"
    stubs.mkdir()
    _stub(stubs / "srun", "exit 75\n")  # every rank stopped at a checkpoint
    _stub(
        stubs / "scontrol",
        f"""\
        test "$1 $2" = "show hostnames" && {{ echo n1; exit 0; }}
        echo "$@" >> {shlex.quote(str(calls))}
        """,
    )
    env = {"PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_ID": "4321", "SLURM_JOB_NODELIST": "n1"}
    env["SLURM_RESTART_COUNT"] = restart
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 75, proc.stderr  # srun's status is the job's
    assert (calls.read_text() if calls.exists() else "") == ("requeue 4321\n" if requeued else "")
    assert ("[specdraft] requeueing job 4321" in proc.stdout) == requeued
    assert (run_dir / "requeue-request").exists() == (request_text is not None and not requeued)
