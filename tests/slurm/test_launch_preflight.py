"""Preflight: what the cluster can never run is refused before sbatch, naming the field, the request and the cluster.

The check itself is a pure function of the layout and what scontrol/sinfo print, tested here on their real output
formats; the `slurm`-marked tests ask the real local cluster (4 nodes n1..n4, 4 CPUs and about 6 GB each, no GPUs,
partition debug with no time limit).
"""

from __future__ import annotations

import subprocess

import pytest

from specdraft.execute.slurm.preflight import Node, Partition, check, gpus_in_gres, parse_nodes, parse_partitions
from specdraft.spec.load import load_layout
from tests.support.paths import SHIPPED

SCONTROL = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-4] State=UP TotalCPUs=16 TotalNodes=4 "
    "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=16,mem=24104M,node=4,billing=16\n"
    "PartitionName=gpu Default=NO MaxNodes=2 MaxTime=1-00:00:00 MaxCPUsPerNode=64 MaxMemPerNode=512000 "
    "Nodes=g[1-3] State=UP TotalNodes=3\n"
)
SINFO_GPU = "g1|96|1024000|gpu:h100:8(S:0-1)\ng2|96|1024000|gpu:h100:8(S:0-1)\ng3|96|1024000|gpu:h100:4\n"
LAYOUT = SHIPPED / "tiny-cpu.yaml"


def _spec(*overrides):
    return load_layout(None, list(overrides))


def _gpu_partition() -> Partition:
    part = [p for p in parse_partitions(SCONTROL) if p.name == "gpu"][0]
    return Partition(**{**part.__dict__, "nodes": parse_nodes(SINFO_GPU)})


def test_scontrol_and_sinfo_output_is_parsed():
    debug, gpu = parse_partitions(SCONTROL)
    assert (debug.name, debug.default, debug.max_time_s, debug.max_nodes, debug.max_cpus_per_node) == (
        "debug",
        True,
        None,
        None,
        None,
    )
    assert (gpu.default, gpu.max_time_s, gpu.max_nodes, gpu.max_cpus_per_node, gpu.max_mem_per_node_mb) == (
        False,
        86400,
        2,
        64,
        512000,
    )
    assert parse_nodes("n1|4|6026|(null)\nn1|4|6026|(null)\nn2|4+|6026|(null)\n") == (
        Node("n1", 4, 6026, 0),
        Node("n2", 4, 6026, 0),
    )
    assert [
        gpus_in_gres(g)
        for g in ("(null)", "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:v100:2", "gpu:h100:8(S:0-1),shard:16")
    ] == [0, 8, 8, 6, 8]


def test_every_impossible_request_names_its_field_what_was_asked_and_what_the_cluster_has():
    part = _gpu_partition()
    gpu = ["cluster.gpu=h100-80gb", "slurm.partition=gpu", "slurm.cpus_per_task=8"]
    assert check(_spec(*gpu, "cluster.num_nodes=2", "cluster.gpus_per_node=8", "parallel.tp=2"), part, []) == []
    cases = {
        # field: (overrides, words the rule must hold)
        "slurm.time": (
            [*gpu, "cluster.gpus_per_node=8", "parallel.tp=2", "slurm.time=2-00:00:00"],
            ["172,800 s", "at most 86,400 s"],
        ),
        "cluster.num_nodes": (
            [
                *gpu,
                "cluster.num_nodes=3",
                "cluster.gpus_per_node=4",
                "parallel.cp=1",
                "parallel.pp=1",
                "training.global_batch_size=12",
            ],
            ["3 nodes", "at most 2 per job"],
        ),
        "slurm.cpus_per_task": (
            [*gpu[:2], "slurm.cpus_per_task=16", "cluster.gpus_per_node=8", "parallel.tp=2"],
            ["8 tasks per node", "= 128 CPUs per node", "at most 64"],
        ),
        "slurm.extra_sbatch_args[0]": (
            [*gpu, "cluster.gpus_per_node=8", "parallel.tp=2", "slurm.extra_sbatch_args=[--mem-per-cpu=8G]"],
            ["524,288 MB per node", "at most 512,000 MB"],
        ),
    }
    for field, (overrides, words) in cases.items():
        problems = check(_spec(*overrides), part, [])
        assert [p.path for p in problems] == [field], (field, problems)
        assert all(w in problems[0].rule for w in words), (field, problems[0].rule)
    # 16 GPUs per node: no node has them; 2 nodes with 8 GPUs fit only g1 and g2 (g3 has 4), so 2 is fine, 3 is not.
    assert [
        p.path
        for p in check(_spec(*gpu, "cluster.gpus_per_node=16", "parallel.tp=4", "slurm.cpus_per_task=4"), part, [])
    ] == ["cluster.gpus_per_node"]
    three = Partition(**{**part.__dict__, "max_nodes": None})
    problems = check(
        _spec(*gpu, "cluster.num_nodes=3", "cluster.gpus_per_node=8", "parallel.tp=2", "training.global_batch_size=12"),
        three,
        [],
    )
    assert [p.path for p in problems] == ["cluster.num_nodes"] and "only 2 node(s)" in problems[0].rule
    missing = check(_spec("slurm.partition=gpu2"), None, ["debug", "gpu"])
    assert [p.path for p in missing] == ["slurm.partition"] and "(it has: debug, gpu)" in missing[0].rule


# ------------------------------------------------------------------ against the real local cluster


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_the_default_cpus_per_task_on_two_tiny_nodes_is_refused_and_nothing_is_submitted(
    slurm_cluster, specdraft_cli, tmp_path
):
    # A new user's layout: tiny-cpu on two nodes, slurm.cpus_per_task left at the schema's default of 8.
    layout = tmp_path / "two-nodes.yaml"
    layout.write_text(
        "".join(line for line in LAYOUT.read_text().splitlines(keepends=True) if "cpus_per_task" not in line)
    )
    args = [layout, "cluster.num_nodes=2", "cluster.gpus_per_node=2", "slurm.partition=debug"]
    proc = specdraft_cli("launch", *args, "--executor", "slurm")
    assert proc.returncode == 2
    assert (
        "slurm.cpus_per_task = 8: 2 tasks per node (cluster.gpus_per_node) x 8 CPUs per task = 16 CPUs per "
        "node, but the nodes of partition debug have at most 4; set slurm.cpus_per_task to 2 or less"
    ) in proc.stderr, proc.stderr
    assert "nothing was submitted" in proc.stderr and not (tmp_path / "runs").exists()
    name = [
        w
        for w in specdraft_cli("launch", *args, "--executor", "slurm", "--dry-run").stdout.split()
        if w.startswith("--job-name=")
    ][0].split("=", 1)[1]
    queued = subprocess.run(["squeue", "-h", f"--name={name}"], capture_output=True, text=True, timeout=15)
    assert queued.returncode == 0 and queued.stdout.strip() == ""
    validate = specdraft_cli("validate", "--cluster", *args)
    assert validate.returncode == 2 and "slurm.cpus_per_task = 8" in validate.stderr
    ok = specdraft_cli("validate", "--cluster", *args, "slurm.cpus_per_task=2")
    assert ok.returncode == 0 and "the cluster can run it: partition debug (4 nodes)" in ok.stdout, ok.stderr


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_nodes_gpus_and_memory_the_cluster_lacks_are_each_named(slurm_cluster, specdraft_cli, tmp_path):
    base = ["slurm.partition=debug", "slurm.cpus_per_task=1"]
    proc = specdraft_cli("validate", "--cluster", *base, "cluster.num_nodes=8", "cluster.gpus_per_node=1")
    assert proc.returncode == 2
    assert (
        f"cluster.num_nodes = 8: asks 8 nodes, but partition debug has {slurm_cluster.num_nodes} node(s)" in proc.stderr
    ), proc.stderr
    proc = specdraft_cli(
        "launch",
        "--executor",
        "slurm",
        *base,
        "cluster.num_nodes=2",
        "cluster.gpus_per_node=2",
        "cluster.gpu=h100-80gb",
        "slurm.extra_sbatch_args=[--mem=100G]",
    )
    assert proc.returncode == 2 and "2 problems" in proc.stderr, proc.stderr
    assert "cluster.gpus_per_node = 2: asks 2 GPUs per node (gres gpu:2)" in proc.stderr and "have none" in proc.stderr
    assert "slurm.extra_sbatch_args[0] = '--mem=100G': asks 102,400 MB per node" in proc.stderr
    assert not (tmp_path / "runs").exists()
