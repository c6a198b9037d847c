"""Co-training on the real Slurm cluster: two pipeline stages on two emulated nodes, so every tap crosses nodes."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slurm
TWO_NODES = [
    "cluster.num_nodes=2",
    "cluster.gpus_per_node=1",
    "parallel.cp=1",
    "slurm.partition=debug",
    "slurm.cpus_per_task=1",
    "slurm.time=00:05:00",
    "training.warmup_steps=0",
]


@pytest.mark.timeout(300)
def test_cotrain_across_two_nodes(slurm_cluster, specdraft_cli, tmp_path):
    plan_file = tmp_path / "plan.json"
    assert specdraft_cli("plan", *TWO_NODES, "--format", "json", "-o", plan_file).returncode == 0
    plan = json.loads(plan_file.read_text())
    routes = [r for r in plan["tap_routes"] if not r["local"]]
    assert routes and all(r["cross_node"] for r in routes), "stage 0 on n1, the draft's stage on n2"

    folder = tmp_path / "run"
    proc = specdraft_cli(
        "launch",
        plan_file,
        "--executor",
        "slurm",
        "--workload",
        "cotrain",
        "--steps",
        "3",
        "--run-dir",
        folder,
        "--wait",
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 2 ranks passed cotrain" in proc.stdout and "draft acceptance" in proc.stdout
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # Every step the draft's rank received the embedding and both off-stage taps, for each of 4 microbatches:
    # exactly the plan's bytes for the hidden states; the embedding sends each distinct token once (a row or so
    # fewer per sequence than the plan's one-row-per-token estimate).
    per_step = sum(r["bytes_per_microbatch"] for r in routes) * plan["parallel"]["num_microbatches"]
    hidden = (
        sum(r["bytes_per_microbatch"] for r in routes if r["tap"] != "embedding") * plan["parallel"]["num_microbatches"]
    )
    assert all(hidden < r["tap_bytes"] <= per_step and r["tap_bytes"] > 0.95 * per_step for r in rows)
    results = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in (folder / "results").glob("*.json")}
    assert {r["node"] for r in results.values()} == {0, 1}
    assert rows[-1]["target_loss"] < rows[0]["target_loss"]
