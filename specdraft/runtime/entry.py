"""The payload on every rank: `python -m specdraft.runtime.entry RUN_DIR/plan.json [--workload W] [--steps N]
[--resume | --resume-from CHECKPOINT]`.

Env -> checks against the plan -> torch.distributed + megatron groups -> workload -> results/rank-NNNNN.json.
Exit codes: 0 ok, 1 failed, 2 a refused resume or a bad data file (the user's to fix), 75 preempted after saving
(preempt.py), 143 terminated by a signal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
import traceback
from importlib import import_module
from pathlib import Path

from specdraft.datafile import DataError
from specdraft.errors import SpecdraftError, UserError, headline_of
from specdraft.plan.codec import PlanFormatError
from specdraft.plan.model import LaunchPlan
from specdraft.runs.checkpoints import ResumeError
from specdraft.runs.paths import MAX_PLAN_BYTES, USER_ERROR_EXIT, RunPaths
from specdraft.runtime.context import RankContext
from specdraft.runtime.tool import exit_now
from specdraft.runtime.train import preempt
from specdraft.runtime.train.preempt import Terminated

# name -> "module:function"; imported only when chosen, so a missing module fails only the workload that needs it.
WORKLOADS = {
    "selftest": "specdraft.runtime.workloads.selftest:run",
    "cotrain": "specdraft.runtime.workloads.cotrain:run",
    "grpo": "specdraft.runtime.workloads.grpo:run",
}
FAULT_ENV = "SPECDRAFT_FAULT_RANK"  # test-only: this rank raises just before the workload (a real fault)
TIMEOUT_ENV = "SPECDRAFT_DIST_TIMEOUT_S"
TRAINING_WORKLOADS = ("cotrain", "grpo")  # they read the HF checkpoint, the draft's and the data file


class WorkloadUnavailable(RuntimeError):
    pass


def load_workload(name: str):
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    module_name, _, func = WORKLOADS[name].partition(":")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise WorkloadUnavailable(
            f"workload {name!r} is not available yet: {module_name} is not part of this "
            "specdraft; run --workload selftest"
        ) from None
    return getattr(module, func)


def rank_env(environ) -> tuple[int, int, int, int]:
    """(global_rank, local_rank, world_size, node) from torchrun-style env, else from Slurm's."""

    def need(*names):
        missing = [n for n in names if n not in environ]
        if missing:
            raise ValueError(
                f"missing environment variable(s) {', '.join(missing)}: run this through "
                "`specdraft launch` (Slurm or local), or set RANK/WORLD_SIZE/LOCAL_RANK yourself"
            )
        return [int(environ[n]) for n in names]

    if not {"MASTER_ADDR", "MASTER_PORT"} <= set(environ):
        raise ValueError(
            "MASTER_ADDR and MASTER_PORT must be set (the sbatch script exports them from the "
            "allocation; the local executor sets 127.0.0.1 and a free port)"
        )
    if "RANK" in environ or "WORLD_SIZE" in environ:
        rank, world, local = need("RANK", "WORLD_SIZE", "LOCAL_RANK")
        return rank, local, world, int(environ.get("GROUP_RANK", "0"))
    rank, world, local, node = need("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")
    return rank, local, world, node


def check_placement(plan: LaunchPlan, rank: int, local_rank: int, world_size: int, node: int) -> None:
    """The environment's world and this rank's place in it must be the plan's."""
    from specdraft.plan.grid import RankGrid

    if world_size != plan.world_size or len(plan.ranks) != plan.world_size:
        raise ValueError(
            f"WORLD_SIZE is {world_size} but the plan's world_size is {plan.world_size} with "
            f"{len(plan.ranks)} rank records: the allocation does not match the plan (nodes x tasks "
            "per node)"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    me = plan.ranks[rank]
    grid = RankGrid(sizes=plan.parallel, gpus_per_node=plan.cluster.gpus_per_node)
    if me != grid.placement(rank):
        raise ValueError(
            f"plan.json's ranks[{rank}] is {me} but its own layout gives {grid.placement(rank)}: the "
            "plan was edited or is stale; recompile it with `specdraft plan`"
        )
    if (local_rank, node) != (me.local_rank, me.node):
        raise ValueError(
            f"rank {rank} runs as local rank {local_rank} on node {node}, but the plan places it as "
            f"local rank {me.local_rank} on node {me.node}: tasks must be laid out in blocks of "
            "gpus_per_node per node (sbatch --ntasks-per-node, the default block distribution)"
        )


def init_megatron(plan: LaunchPlan, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    import warnings

    # Expected without TE/Apex; four copies per rank would bury a real error in the stderr tail we report.
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    par = plan.parallel
    dist.init_process_group(
        backend, init_method="env://", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )
    ps.initialize_model_parallel(
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        virtual_pipeline_model_parallel_size=par.vpp,
        context_parallel_size=par.cp,
        hierarchical_context_parallel_sizes=list(par.hierarchical_cp_sizes) if par.hierarchical_cp_sizes else None,
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.etp,
        order=par.order,
        distributed_timeout_minutes=max(1, int(timeout_s // 60)),
        # On gloo the default groups already are gloo groups; duplicates would only double the set-up time.
        create_gloo_process_groups=backend != "gloo",
    )
    if backend == "nccl":
        # megatron's GPU weight init and its layers' forks draw from the CUDA RNG tracker, which only this call fills
        # ("cuda rng state model-parallel-rng is not added" otherwise); on CPU cpu_compat makes the forks no-ops.
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(plan.training.seed)


def check_megatron_ranks(plan: LaunchPlan, rank: int) -> dict:
    """Megatron's view of this rank must equal the plan's; returns megatron's coordinates."""
    from megatron.core import parallel_state as ps

    got = {
        "tp": ps.get_tensor_model_parallel_rank(),
        "cp": ps.get_context_parallel_rank(),
        "dp": ps.get_data_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
        "ep": ps.get_expert_model_parallel_rank(),
        "etp": ps.get_expert_tensor_parallel_rank(),
        "edp": ps.get_expert_data_parallel_rank(),
    }
    me = plan.ranks[rank]
    bad = {k: (getattr(me, k), v) for k, v in got.items() if getattr(me, k) != v}
    if bad:
        detail = ", ".join(f"{k}: plan {p} vs megatron {m}" for k, (p, m) in bad.items())
        raise ValueError(
            f"rank {rank}: megatron-core placed this rank differently from the plan ({detail}); "
            f"the plan's rank order {plan.parallel.order!r} and megatron disagree"
        )
    return got


def _device(plan: LaunchPlan, local_rank: int) -> tuple[str, str]:
    gpu = plan.cluster.gpu
    if gpu == "cpu":
        return "cpu", "gloo"
    from specdraft.plan.environment import nccl_env

    # What the sbatch script exports, for launchers that do not (the local one); before CUDA and NCCL start, since
    # both read them once. A value the launcher or the user set wins.
    for name, value, _why in nccl_env(plan):
        os.environ.setdefault(name, value)
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            f"the plan is for {gpu} GPUs but torch.cuda.is_available() is False on "
            f"{socket.gethostname()}; use a CUDA build of torch, or cluster.gpu=cpu for a CPU run"
        )
    # Before NCCL's init: every communicator this rank creates binds to its own GPU.
    torch.cuda.set_device(local_rank)
    # fp32 means fp32: no TF32 matmuls (torch's default for matmul, not for cuDNN); bf16/fp16 runs are unaffected.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return f"cuda:{local_rank}", "nccl"


def read_plan(path: Path) -> LaunchPlan:
    """plan.json through the typed contract (schema_version checked); launch verified it against compile."""
    from specdraft.fsutil import read_regular_text
    from specdraft.runs.files import parse_json

    return LaunchPlan.from_dict(parse_json(read_regular_text(path, MAX_PLAN_BYTES, "plan file"), str(path)))


def write_result(run_dir: Path, rank: int, record: dict) -> Path:
    from specdraft.fsutil import atomic_write_text

    return atomic_write_text(
        RunPaths(run_dir).result(rank), json.dumps(record, sort_keys=True) + "\n", what="result file"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdraft.runtime.entry", description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="RUN_DIR/plan.json; results go next to it")
    parser.add_argument("--workload", default="selftest", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=None)
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in the run folder (same spec)",
    )
    resume.add_argument(
        "--resume-from",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="continue from this checkpoint folder (any run or layout of the same model shape)",
    )
    parser.add_argument(
        "--allow-data-change",
        action="store_true",
        help="a resume may continue with a data file other than the checkpoint's (it starts at its first sample)",
    )
    parser.add_argument(
        "--measure-activations",
        action="store_true",
        help="cotrain: count the bytes saved for backward per microbatch in the first step (results' memory)",
    )
    args = parser.parse_args(argv)
    if args.measure_activations:
        from specdraft.runtime.train.activations import MEASURE_ENV

        os.environ[MEASURE_ENV] = "1"

    preempt.install()
    started = time.time()
    plan_path = Path(args.plan).absolute()
    run_dir = plan_path.parent
    record: dict = {
        "hostname": socket.gethostname(),
        "workload": args.workload,
        "started_at": started,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "pid": os.getpid(),
    }
    rank = None
    ctx: RankContext | None = None
    try:
        rank, local_rank, world_size, node = rank_env(os.environ)
        record.update(global_rank=rank, local_rank=local_rank, node=node)
        plan = read_plan(plan_path)
        if 0 <= rank < len(plan.ranks):
            me = plan.ranks[rank]
            record["coords"] = {k: getattr(me, k) for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp")}
        check_placement(plan, rank, local_rank, world_size, node)
        workload = load_workload(args.workload)
        # What every rank reads is checked before the first collective: a bad file fails every rank alike.
        data = check_inputs(plan, args.workload) if args.workload in TRAINING_WORKLOADS else None
        device, backend = _device(plan, local_rank)
        record.update(device=device, backend=backend)
        # torchrun's names, for code that reads them (MASTER_ADDR/MASTER_PORT come from the launcher).
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
        init_megatron(plan, rank, world_size, backend, float(os.environ.get(TIMEOUT_ENV, "300")))
        record["megatron"] = check_megatron_ranks(plan, rank)
        steps = args.steps if args.steps is not None else plan.training.train_iters
        # A job Slurm restarted continues its own newest checkpoint whatever flag it was launched with: the
        # script (and so --resume-from) is the same on every restart (runs/checkpoints.choose, mode "auto").
        mode = preempt.resume_mode_from_env(os.environ) or (
            "from" if args.resume_from is not None else "newest" if args.resume else None
        )
        ctx = RankContext(
            plan=plan,
            run_dir=run_dir,
            global_rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            node=node,
            device=device,
            backend=backend,
            steps=steps,
            workload=args.workload,
            resume=mode,
            resume_from=args.resume_from,
            data=data,
            allow_data_change=args.allow_data_change,
        )
        fault = os.environ.get(FAULT_ENV)
        if fault is not None and fault.strip() == str(rank):
            raise RuntimeError(f"injected fault on rank {rank} ({FAULT_ENV}={fault})")
        out = workload(ctx) or {}
        record.update(out)
        record["warnings"] = list(ctx.warnings)
        failed = [c for c in record.get("checks", []) if not c["passed"]]
        preempted = record.get("preempted")
        record.update(ok=not failed and not preempted, error=None, terminated=bool(preempted), finished_at=time.time())
        if failed:
            record["error"] = "failed checks: " + "; ".join(
                f"{c['name']} got {c.get('value')} expected {c.get('expected')}" for c in failed
            )
        record["elapsed_s"] = round(record["finished_at"] - started, 3)
        write_result(run_dir, rank, record)
        outcome = (
            "FAILED: " + record["error"]
            if failed
            else "ok"
            if not preempted
            else f"preempted ({preempted['signal']}) after step {preempted['step']}: {preempted['checkpoint']}"
        )
        print(f"[specdraft] rank {rank}: {args.workload} {outcome}", flush=True)
        _teardown()
        return 1 if failed else preempt.PREEMPTED_EXIT if preempted else 0
    except BaseException as err:
        # A plan this version cannot read is the user's to fix: one line, no traceback.
        tail = (
            [str(err)]
            if isinstance(err, (ResumeError, DataError, UserError))
            else [f"{plan_path}: {err}"]
            if isinstance(err, (PlanFormatError, SpecdraftError))
            else traceback.format_exc().splitlines()[-30:]
        )
        # A rank asked to stop whose peers are gone fails in the next collective: that, too, is not its fault.
        terminated = isinstance(err, (Terminated, KeyboardInterrupt)) or preempt.terminating()
        record.update(
            ok=False,
            terminated=terminated,
            warnings=list(ctx.warnings) if ctx is not None else [],
            error="\n".join(tail),
            error_type=type(err).__name__,
            failed_at=time.time(),
            finished_at=time.time(),
        )
        print("\n".join(tail), file=sys.stderr, flush=True)
        headline = headline_of(err)
        if headline:  # a rank's one-line summaries show the last line: make it the problem, not the fix
            record["error"] += "\n" + headline
        if rank is not None and rank >= 0:
            try:
                write_result(run_dir, rank, record)
            except OSError as werr:
                print(f"[specdraft] could not write the result file: {werr}", file=sys.stderr, flush=True)
        return 143 if terminated else USER_ERROR_EXIT if isinstance(err, (ResumeError, DataError, UserError)) else 1


def check_inputs(plan: LaunchPlan, workload: str):
    """The checks of every training workload (cotrain, grpo) before any collective: the HF checkpoint the policy
    starts from (config.json and the safetensors headers against the plan's model), the draft's (draft.path), and
    the data file read and tokenised, returned for the workload (ctx.data; None for the built-in data): cotrain's
    training samples, or grpo's prompts (each row's prompt through the chat template, its reference answer)."""
    from specdraft.runtime.models.eagle3_import import open_source
    from specdraft.runtime.models.hf.checkpoint import plan_checkpoint

    plan_checkpoint(plan)
    open_source(plan)
    if plan.data.path is None:
        return None
    if workload == "grpo":
        from specdraft.runtime.rl.prompts import load_prompt_file

        return load_prompt_file(plan)
    from specdraft.runtime.train.corpus import load_corpus

    return load_corpus(plan)


def _teardown() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    exit_now(main())
