"""What the rendered script asks of Slurm reaches the job, and container mode's requeue works, on the real local
cluster.

- `slurm.mem` and `slurm.max_requeues > 0` become `#SBATCH --mem` and `--requeue`: `scontrol show job` of the held
  job shows MinMemoryNode and Requeue=1.
- Container mode without enroot: this machine has no pyxis, so an `srun` on PATH (sbatch exports PATH to the job)
  records the `--container-image`/`--container-mounts` it is given, drops them and runs the real srun: the ranks run
  on the host in place of the image. Everything else is container mode as rendered: the payload is the mounted
  specdraft's (`python -c` with the package folder first on sys.path), rank 0 does not run scontrol but leaves
  RUN/requeue-request, and the batch script requeues the job after srun returns. The time-limit warning is sent by
  hand (`scancel --signal=USR2`, which reaches the steps, not the batch shell) once a checkpoint exists; the
  requeued job resumes and completes. What this cannot show: pyxis itself, the image's python, a real mount.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdraft.runs.checkpoints import MARKER

pytestmark = pytest.mark.slurm
BASE = ["cluster.num_nodes=2", "cluster.gpus_per_node=1", "parallel.cp=1", "slurm.partition=debug"]
BASE += ["slurm.cpus_per_task=1", "training.warmup_steps=0", "--executor", "slurm"]
STEPS = 12
WATCH_S = 360
RELEASE_AFTER_S = 3.0  # past the one-second credential revocation of a requeue (tests/slurm/test_preempt_slurm.py)
FAKE_SRUN = """#!/bin/bash
# pyxis stand-in: record the container options, drop them, run the real srun (the "container" is the host).
args=()
for a in "$@"; do
  case "$a" in
    --container-image=*|--container-mounts=*) printf '%s\\n' "$a" >> {record} ;;
    *) args+=("$a") ;;
  esac
done
exec /usr/bin/srun "${{args[@]}}"
"""


def _run(cmd: list[str], timeout: float = 15) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False).stdout.strip()


def _job(folder: Path) -> str:
    return json.loads((folder / "run.json").read_text())["job_id"]


@pytest.mark.timeout(90)
def test_mem_and_requeue_reach_the_job(slurm_cluster, specdraft_cli, tmp_path):
    folder = tmp_path / "held"
    extra = ["slurm.mem=300M", "slurm.max_requeues=2", "slurm.extra_sbatch_args=[--hold]", "--run-dir", folder]
    proc = specdraft_cli("launch", *BASE, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = _job(folder)
    try:
        script = (folder / "sbatch.sh").read_text()
        assert "#SBATCH --mem=300M\n" in script and "#SBATCH --requeue\n" in script
        shown = _run(["scontrol", "show", "job", job]).split()
        assert "Requeue=1" in shown and "MinMemoryNode=300M" in shown, shown
    finally:
        _run(["scancel", job])


@pytest.mark.timeout(WATCH_S + 120)
def test_container_mode_requeues_from_the_batch_script_and_resumes(slurm_cluster, specdraft_cli, tmp_path):
    stubs, record = tmp_path / "bin", tmp_path / "container-options"
    stubs.mkdir()
    (stubs / "srun").write_text(FAKE_SRUN.format(record=record))
    (stubs / "srun").chmod(0o755)
    folder = tmp_path / "run"
    layout = [
        *BASE,
        "slurm.container_image=nvcr.io#nvidia/nemo-rl:v0.4.0",
        "slurm.container_specdraft=mount",
        "slurm.time=00:05:00",
        "slurm.max_requeues=2",
        "training.save_interval=4",
        f"training.train_iters={STEPS}",
        "slurm.env.SPECDRAFT_STEP_PAUSE_S=0.3",
    ]
    env = {"PATH": f"{stubs}:/usr/bin:/bin:/usr/sbin:/sbin"}
    proc = specdraft_cli("launch", *layout, "--python", sys.executable, "--run-dir", folder, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = _job(folder)
    try:
        signalled, releases = _watch(job, folder)
    finally:
        if _run(["squeue", "-h", "-j", job, "-o", "%T"]):
            _run(["scancel", job])
    logs = {p.name: p.read_text(errors="replace") for p in (folder / "submitit").glob("*_log.*")}
    story = (
        _run(["sacct", "-D", "-X", "-P", "-j", job, "-o", "JobID,State,ExitCode"])
        + logs.get(f"{job}_0_log.err", "")[-3000:]
    )
    assert signalled and releases >= 1, story
    assert _sacct_state(job) == "COMPLETED", story
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS)), "every step exactly once"
    rank0 = logs[f"{job}_0_log.out"]
    assert "requeued (requeue 1 of at most 2, asked of the batch script" in rank0, rank0[-3000:]
    assert f"[specdraft] requeueing job {job}, as rank 0 asked after its checkpoint" in rank0
    assert not (folder / "requeue-request").exists(), "the batch script consumed the request"
    result = json.loads((folder / "results" / "rank-00000.json").read_text())
    assert result["ok"] and result["resumed_step"] >= 4
    options = record.read_text().splitlines()
    package = str(Path(__import__("specdraft").__file__).parent)
    assert options[0] == "--container-image=nvcr.io#nvidia/nemo-rl:v0.4.0"
    assert options[1] == f"--container-mounts={folder}:{folder},{package}:{package}:ro"
    status = specdraft_cli("status", folder, timeout=60).stdout
    assert "state COMPLETED" in status and f"restarts of job {job} by Slurm (requeues): 1" in status


def _watch(job: str, folder: Path) -> tuple[bool, int]:
    """USR2 once a checkpoint exists; release the requeue's BeginTime hold; until the job leaves the queue."""
    deadline, signalled, releases, held = time.monotonic() + WATCH_S, False, 0, None
    while time.monotonic() < deadline:
        state = _run(["squeue", "-h", "-j", job, "-o", "%T|%r"])
        if not state:
            return signalled, releases
        if not signalled and (folder / "checkpoints" / "step-4" / MARKER).is_file():
            _run(["scancel", "--signal=USR2", job])
            signalled = True
        if state != "PENDING|BeginTime":
            held = None
        elif held is None:
            held = time.monotonic()
        elif time.monotonic() - held >= RELEASE_AFTER_S:
            _run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
            releases, held = releases + 1, None
        time.sleep(0.5)
    pytest.fail(f"job {job} still queued or running after {WATCH_S} s")


def _sacct_state(job: str) -> str:
    state: list[str] = []
    for _ in range(60):  # sacct can lag the end of a job by a moment
        state = _run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"]).split()
        if state and state[0] not in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING"):
            return state[0]
        time.sleep(0.5)
    return state[0] if state else "UNKNOWN"
