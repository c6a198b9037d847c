"""In a container rank 0 cannot run scontrol: it leaves RUN/requeue-request for the batch script, bounded by
slurm.max_requeues like the host's own requeue."""

from __future__ import annotations

from specdraft.assemble import compile
from specdraft.runtime.train import preempt
from specdraft.spec.load import load_layout

CONTAINER = ["slurm.container_image=nvcr.io#nvidia/nemo-rl:v0.4.0", "slurm.container_specdraft=image"]


def test_a_container_rank_asks_the_batch_script(tmp_path):
    plan = compile(load_layout(None, [*CONTAINER, "slurm.max_requeues=2"]))
    asked = preempt.request_requeue(plan, {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}, run_dir=tmp_path)
    assert asked == {
        "requeued": True,
        "reason": "requeue 2 of at most 2, asked of the batch script (the container has no Slurm)",
        "restarts": 1,
    }
    assert (tmp_path / "requeue-request").read_text() == "77 1\n"


def test_a_spent_container_job_leaves_no_request(tmp_path):
    plan = compile(load_layout(None, [*CONTAINER, "slurm.max_requeues=1"]))
    spent = preempt.request_requeue(plan, {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}, run_dir=tmp_path)
    assert not spent["requeued"] and not (tmp_path / "requeue-request").exists()
