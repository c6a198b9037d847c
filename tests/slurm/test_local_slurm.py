"""End-to-end checks of submitit against the real local Slurm cluster (scripts/local-slurm.sh)."""

from __future__ import annotations

import contextlib
import subprocess
import time

import pytest
import submitit
from submitit.core.utils import UncompletedJobError

pytestmark = pytest.mark.slurm


def _executor(folder, cluster, **params) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    # timeout_min <= 2 would let submitit's default USR2@90 signal fire at once (90 s before a 2-minute limit).
    executor.update_parameters(slurm_partition=cluster.partition, timeout_min=5, **params)
    return executor


def _poll(what: str, seconds: float, probe):
    """Call probe() until it returns something truthy; fail (not hang) after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen within {seconds:.0f} s")
        time.sleep(0.5)


def _slurm_field(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=False)
    return proc.stdout.strip()


def _squeue_state(job_id: str) -> str:
    return _slurm_field(["squeue", "-h", "-j", job_id, "-o", "%T"])


def _sacct_state(job_id: str) -> str:
    return _slurm_field(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])


@contextlib.contextmanager
def _cancelled_on_failure(job):
    """Leave no job running on the shared cluster when a test fails or times out."""
    try:
        yield
    except BaseException:
        job.cancel(check=False)
        raise


@pytest.mark.timeout(240)
def test_gloo_all_reduce_over_two_nodes(slurm_cluster, tmp_path):
    if slurm_cluster.num_nodes < 2:
        pytest.skip(f"needs 2 nodes, the cluster has {slurm_cluster.num_nodes}")

    # Nested, so cloudpickle ships it by value: the job cannot import this test module.
    def all_reduce_rank() -> dict:
        import os

        import submitit
        import torch
        import torch.distributed as dist

        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        dist.init_process_group("gloo")
        try:
            total = torch.tensor([float(env.rank)], dtype=torch.float64)
            dist.all_reduce(total)
            return {
                "rank": env.rank,
                "world_size": env.world_size,
                "sum": total.item(),
                "node_id": int(os.environ["SLURM_NODEID"]),
            }
        finally:
            dist.destroy_process_group()

    executor = _executor(tmp_path / "submitit", slurm_cluster, nodes=2, tasks_per_node=2, cpus_per_task=1)
    job = executor.submit(all_reduce_rank)
    with _cancelled_on_failure(job):
        results = job.results()  # several tasks: result() would raise

    world = 4
    assert sorted(r["rank"] for r in results) == list(range(world))
    assert all(r["world_size"] == world for r in results)
    assert all(r["sum"] == sum(range(world)) for r in results), results
    assert {r["node_id"] for r in results} == {0, 1}


@pytest.mark.timeout(180)
def test_cancelled_job_raises_and_is_accounted(slurm_cluster, tmp_path):
    def sleep_long() -> None:
        import time

        time.sleep(600)

    executor = _executor(tmp_path / "submitit", slurm_cluster, nodes=1, tasks_per_node=1, cpus_per_task=1)
    job = executor.submit(sleep_long)
    with _cancelled_on_failure(job):
        _poll(f"job {job.job_id} RUNNING", 60, lambda: _squeue_state(job.job_id) == "RUNNING")
        job.cancel(check=True)
        with pytest.raises(UncompletedJobError, match="CANCELLED"):
            job.result()

    # sacct can lag the cancellation by a moment; its state reads e.g. "CANCELLED by 0".
    _poll(f"sacct CANCELLED for job {job.job_id}", 30, lambda: _sacct_state(job.job_id).startswith("CANCELLED"))
