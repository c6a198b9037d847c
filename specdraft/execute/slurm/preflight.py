"""Preflight: ask the Slurm cluster (bounded scontrol/sinfo calls) whether a layout's request could ever run there.

Checked against the partition and its nodes: the partition exists; the node count; tasks x CPUs per task per node;
GPUs per node (gres); memory asked by `slurm.mem` or `slurm.extra_sbatch_args`; the time limit. Every problem names
the spec field, what was asked and what the cluster has. Node states are ignored on purpose: a drained node may come
back, so only what no node of the partition could ever give is refused. A layout or its plan is checked alike: only
their cluster and slurm sections are read, which the plan's resolved sections spell as the spec does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, Union, overload

from specdraft.errors import Problem, SpecError, UserError
from specdraft.execute.slurm import commands as slurmcmd
from specdraft.plan.model import LaunchPlan
from specdraft.spec import derived
from specdraft.spec.schema import LayoutSpec

Job = Union[LayoutSpec, LaunchPlan]  # what preflight reads of either: .cluster and .slurm

_UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "")
_MEM_OPTION = re.compile(r"--(mem|mem-per-cpu|mem-per-gpu)=([0-9]+)([KMGT]?)B?", re.IGNORECASE)
_GPU_GRES = re.compile(r"gpu(?::[^:(,]+)?:([0-9]+)")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str
    max_time_s: int | None  # None: unlimited
    max_nodes: int | None
    max_cpus_per_node: int | None
    max_mem_per_node_mb: int | None
    nodes: tuple[Node, ...] = ()


def _fields(line: str) -> dict[str, str]:
    out = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def _limit(text: str | None) -> int | None:
    if text is None or text.upper() in _UNLIMITED:
        return None
    return int(text) if text.isdigit() else None


def _time_limit(text: str | None) -> int | None:
    if text is None or text.upper() in _UNLIMITED:
        return None
    try:
        return derived.slurm_time_seconds(text)
    except ValueError:
        return None  # a form this parser does not know: no limit is assumed, sbatch still checks


def parse_partitions(text: str) -> list[Partition]:
    """`scontrol -a show partition --oneliner` -> partitions (nodes not yet filled in)."""
    out = []
    for line in text.splitlines():
        f = _fields(line)
        if "PartitionName" not in f:
            continue
        out.append(
            Partition(
                name=f["PartitionName"],
                default=f.get("Default") == "YES",
                state=f.get("State", "UP"),
                max_time_s=_time_limit(f.get("MaxTime")),
                max_nodes=_limit(f.get("MaxNodes")),
                max_cpus_per_node=_limit(f.get("MaxCPUsPerNode")),
                max_mem_per_node_mb=_limit(f.get("MaxMemPerNode")),
            )
        )
    return out


def gpus_in_gres(gres: str) -> int:
    """GPUs a node offers in sinfo's %G: "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:v100:2", "(null)"."""
    return sum(int(n) for n in _GPU_GRES.findall(gres))


def parse_nodes(text: str) -> tuple[Node, ...]:
    """`sinfo -h -N -p P -o %N|%c|%m|%G` -> one Node per line (a node listed twice is kept once)."""
    nodes: dict[str, Node] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[1].rstrip("+").isdigit():
            continue
        memory = parts[2].rstrip("+")
        nodes.setdefault(
            parts[0],
            Node(parts[0], int(parts[1].rstrip("+")), int(memory) if memory.isdigit() else 0, gpus_in_gres(parts[3])),
        )
    return tuple(nodes.values())


def read_partition(name: str | None) -> tuple[Partition | None, list[str]]:
    """(the partition, with its nodes; None when the cluster has none of that name) and every partition's name.
    UserError when the cluster does not answer within the bound."""
    answer = slurmcmd.run(["scontrol", "-a", "show", "partition", "--oneliner"])
    if answer is None or answer.returncode != 0:
        why = "did not answer" if answer is None else (answer.stderr.strip().splitlines() or ["failed"])[-1][:200]
        raise UserError(
            f"cannot ask the Slurm cluster: `scontrol show partition` {why}",
            "check that the controller runs (`sinfo`), or launch without preflight by fixing it first",
        )
    partitions = parse_partitions(answer.stdout)
    names = [p.name for p in partitions]
    match = [p for p in partitions if (p.name == name if name else p.default)]
    if not match:
        return None, names
    part = match[0]
    answer = slurmcmd.run(["sinfo", "-h", "-N", f"--partition={part.name}", "-o", "%N|%c|%m|%G"])
    if answer is None or answer.returncode != 0:
        raise UserError(
            f"cannot ask the Slurm cluster: `sinfo` for partition {part.name} did not answer",
            "check that the controller runs (`sinfo`)",
        )
    return Partition(**{**part.__dict__, "nodes": parse_nodes(answer.stdout)}), names


def _memory_mb(spec: Job) -> list[tuple[str, str, int]]:
    """(field path, option text, MB per node) for slurm.mem and each memory option in slurm.extra_sbatch_args."""
    cluster, slurm = spec.cluster, spec.slurm
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    out = []
    asked = [("slurm.mem", f"--mem={slurm.mem}")] if slurm.mem else []
    asked += [(f"slurm.extra_sbatch_args[{i}]", arg) for i, arg in enumerate(slurm.extra_sbatch_args)]
    for path, arg in asked:
        match = _MEM_OPTION.fullmatch(arg.strip())
        if not match:
            continue
        kind, amount, unit = match.group(1).lower(), int(match.group(2)), match.group(3).upper()
        mb = amount * scale[unit]
        per_node = {
            "mem": mb,
            "mem-per-cpu": mb * cluster.gpus_per_node * slurm.cpus_per_task,
            "mem-per-gpu": mb * cluster.gpus_per_node,
        }[kind]
        if amount:  # --mem=0 asks for all of a node's memory
            out.append((path, arg, int(per_node)))
    return out


def check(spec: Job, part: Partition | None, names: list[str]) -> list[Problem]:
    """Every reason the request can never run on ``part``; [] when it could."""
    cluster, slurm = spec.cluster, spec.slurm
    if part is None:
        asked = repr(slurm.partition) if slurm.partition else "the default partition"
        return [
            Problem(
                path="slurm.partition",
                value=slurm.partition,
                rule=f"the cluster has no partition {asked} (it has: {', '.join(names) or 'none'})",
                fix="set slurm.partition to one of those (`sinfo -s` lists them)",
            )
        ]
    where = f"partition {part.name}"
    nodes = part.nodes
    problems = []
    tasks = cluster.gpus_per_node
    cpus = tasks * slurm.cpus_per_task
    gpus = 0 if cluster.gpu == "cpu" else cluster.gpus_per_node
    memory = _memory_mb(spec)
    need_mb = max((mb for _, _, mb in memory), default=0)
    most_cpus = min(max((n.cpus for n in nodes), default=0), part.max_cpus_per_node or 1 << 30)
    if cpus > most_cpus:
        if tasks > most_cpus:
            problems.append(
                Problem(
                    path="cluster.gpus_per_node",
                    value=tasks,
                    rule=(
                        f"asks {tasks} tasks per node (one per rank), but the nodes of {where} have at most "
                        f"{most_cpus} CPUs"
                    ),
                    fix=f"use at most {most_cpus} ranks per node (cluster.gpus_per_node) and more nodes",
                )
            )
        else:
            problems.append(
                Problem(
                    path="slurm.cpus_per_task",
                    value=slurm.cpus_per_task,
                    rule=(
                        f"{tasks} tasks per node (cluster.gpus_per_node) x {slurm.cpus_per_task} CPUs per task = "
                        f"{cpus} CPUs per node, but the nodes of {where} have at most {most_cpus}"
                    ),
                    fix=f"set slurm.cpus_per_task to {most_cpus // tasks} or less",
                )
            )
    most_gpus = max((n.gpus for n in nodes), default=0)
    if gpus > most_gpus:
        has = f"at most {most_gpus}" if most_gpus else "none"
        problems.append(
            Problem(
                path="cluster.gpus_per_node",
                value=gpus,
                rule=(
                    f"asks {gpus} GPUs per node (gres gpu:{gpus}) for cluster.gpu {cluster.gpu}, but the nodes of "
                    f"{where} have {has}"
                ),
                fix="pick a GPU partition (slurm.partition), or use cluster.gpu: cpu for CPU nodes",
            )
        )
    most_mb = min(max((n.memory_mb for n in nodes), default=0), part.max_mem_per_node_mb or 1 << 40)
    for path, arg, mb in memory:
        if mb > most_mb:
            problems.append(
                Problem(
                    path=path,
                    value=arg,
                    rule=(f"asks {mb:,} MB per node, but the nodes of {where} have at most {most_mb:,} MB"),
                    fix="ask for less memory, or leave the option out",
                )
            )
    if cluster.num_nodes > len(nodes) or (part.max_nodes and cluster.num_nodes > part.max_nodes):
        limit = f"{len(nodes)} node(s)" + (f", at most {part.max_nodes} per job" if part.max_nodes else "")
        problems.append(
            Problem(
                path="cluster.num_nodes",
                value=cluster.num_nodes,
                rule=f"asks {cluster.num_nodes} nodes, but {where} has {limit}",
                fix="use fewer nodes, or another partition (slurm.partition)",
            )
        )
    elif not problems:
        fit = [n for n in nodes if n.cpus >= cpus and n.gpus >= gpus and n.memory_mb >= need_mb]
        if len(fit) < cluster.num_nodes:
            problems.append(
                Problem(
                    path="cluster.num_nodes",
                    value=cluster.num_nodes,
                    rule=(
                        f"asks {cluster.num_nodes} nodes with {cpus} CPUs"
                        + (f", {gpus} GPUs" if gpus else "")
                        + (f", {need_mb:,} MB" if need_mb else "")
                        + f" each, but only {len(fit)} node(s) of {where} have "
                        "all of that"
                    ),
                    fix="use fewer nodes, or smaller ones (fewer ranks or CPUs per node)",
                )
            )
    if part.max_time_s is not None:
        limit_s = derived.slurm_time_seconds(slurm.time)
        if limit_s > part.max_time_s:
            problems.append(
                Problem(
                    path="slurm.time",
                    value=slurm.time,
                    rule=(f"asks {limit_s:,} s, but {where} allows at most {part.max_time_s:,} s"),
                    fix=f"set slurm.time to at most {part.max_time_s // 3600:02d}:{part.max_time_s % 3600 // 60:02d}:"
                    f"{part.max_time_s % 60:02d} (or D-HH:MM:SS)",
                )
            )
    return problems


@overload
def require(spec: Job, warn: Callable[[str], None], *, strict: Literal[True], after: str = "") -> Partition: ...


@overload
def require(spec: Job, warn: Callable[[str], None], *, strict: bool = False, after: str = "") -> Partition | None: ...


def require(spec: Job, warn: Callable[[str], None], *, strict: bool = False, after: str = "") -> Partition | None:
    """Raise SpecError (exit 2) listing every reason the cluster can never run ``spec``'s job (``after`` is added to
    the heading). A cluster that does not answer is a warning (sbatch will give its own answer) and None, or a
    UserError when ``strict``."""
    try:
        part, names = read_partition(spec.slurm.partition)
    except UserError as err:
        if strict:
            raise
        warn(f"preflight skipped: {err.message}")
        return None
    problems = check(spec, part, names)
    if problems or part is None:  # check() names a missing partition as a problem
        raise SpecError(problems, f"the Slurm request (partition {part.name if part else spec.slurm.partition}){after}")
    if part.state != "UP":
        warn(f"partition {part.name} is {part.state}: the job will wait until it is UP")
    return part


def describe(spec: Job, part: Partition) -> str:
    """One line on what was asked of which partition, for `validate --cluster`."""
    cluster, slurm = spec.cluster, spec.slurm
    gpus = "" if cluster.gpu == "cpu" else f", {cluster.gpus_per_node} GPUs"
    return (
        f"partition {part.name} ({len(part.nodes)} nodes): {cluster.num_nodes} node(s) x {cluster.gpus_per_node} "
        f"task(s) x {slurm.cpus_per_task} CPU(s){gpus}, slurm.time {slurm.time}"
    )
