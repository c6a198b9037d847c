"""Sharded checkpoints of one co-training run with megatron-core's dist_checkpointing (torch_dist format).

What a checkpoint holds, each rank writing only its shards: the target chunks (`model.sharded_state_dict()`: keyed by
global layer and parameter name, with TP partition info), the draft (Eagle3Draft.sharded_state_dict), both AdamW
optimizers (exp_avg and exp_avg_sq as ShardedTensors keyed and partitioned exactly like their parameter, so they
reshard with it; the step count, shared by every parameter, in the common part), the data position (the step
index: data.py derives every batch from it) and every RNG state (torch CPU, CUDA and megatron's CUDA RNG tracker
where present; per global rank, restored only under the same layout). The learning rate is constant (no schedule
to save). On-disk layout, markers and the choice of checkpoint: plan/checkpoints.py.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from specdraft.plan import checkpoints as files
from specdraft.runtime.context import RankContext

ADAM_STATE = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter tensors (amsgrad off); "step" is shared


@contextlib.contextmanager
def _quiet_writer():
    """Synchronous saves without the writer's extra process, and without torch's deprecation chatter per rank.

    dist_checkpointing's torch_dist writer hands its results back through a queue it builds, on first use, with a
    *spawned* multiprocessing Manager: one more interpreter per rank, left orphaned when the rank leaves through
    os._exit (entry.exit_now) and killed by the USR2 Slurm sends to every process of the step. A synchronous save
    puts and gets in this same process, so a plain queue.Queue does the job (the writers it forks stay as they are).
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*(DTensor|load_state_dict).*")
        yield


def _prefixed(sharded: dict, prefix: str) -> dict:
    """Prefix every ShardedTensor/Factory/Object key in place: dict keys stay the module's own (load_state_dict
    needs them), while the checkpoint's global names say whose tensor it is ("target.", "draft.")."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values

    for value in nested_values(sharded):
        value.key = prefix + value.key
    return sharded


def _optimizer_sharded(optimizer: torch.optim.Optimizer, model_sharded: dict, prefix: str) -> dict:
    """exp_avg/exp_avg_sq of every parameter as a ShardedTensor shaped and keyed like the parameter itself.

    The parameter -> ShardedTensor match is by identity (the model's sharded dict holds the Parameters), the way
    megatron-core's own optimizers do it (dist_checkpointing.optimizer); SwiGLU's fused fc1 comes through its
    ShardedTensorFactory, which splits gate and up again so the state reshards across tp like the weight.
    """
    from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                            make_sharded_optimizer_tensor)

    params = [p for group in optimizer.param_groups for p in group["params"]]
    by_id = get_param_id_to_sharded_param_map(model_sharded, params)
    missing = [i for i in range(len(params)) if i not in by_id]
    if missing:
        raise RuntimeError(f"{len(missing)} optimizer parameter(s) have no entry in the model's sharded state dict "
                           f"(first: shape {tuple(params[missing[0]].shape)}); they could not be checkpointed")
    out = {}
    for i, param in enumerate(params):
        state = optimizer.state[param]
        for name in ADAM_STATE:
            out[f"{name}.{i}"] = make_sharded_optimizer_tensor(by_id[i], state[name], prefix=f"{prefix}{name}")
    return out


def optimizer_step(optimizer: torch.optim.Optimizer) -> int:
    """AdamW's step count, which every parameter shares here (0 before the first step)."""
    steps = {float(s["step"]) for s in optimizer.state.values() if "step" in s}
    if len(steps) > 1:
        raise RuntimeError(f"the optimizer's parameters are at different steps {sorted(steps)}; a checkpoint "
                           "stores one shared step")
    if steps and len(optimizer.state) != sum(len(g["params"]) for g in optimizer.param_groups):
        raise RuntimeError("some optimizer parameters have state and others none; a checkpoint cannot say which")
    return int(steps.pop()) if steps else 0


def _init_optimizer_state(optimizer: torch.optim.Optimizer, step: int) -> None:
    """Fresh state tensors for loading into, with AdamW's own step representation (a float32 scalar tensor)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            optimizer.state[param] = {"step": torch.tensor(float(step), dtype=torch.float32),
                                      **{name: torch.zeros_like(param) for name in ADAM_STATE}}


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
        get_cuda_rng_tracker().set_states(state["tracker"])


def sharded_state(trainer, *, rng: bool, draft_optimizer: bool) -> dict:
    """This rank's part of the checkpoint as a sharded state dict (the template to load into, too)."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    out: dict = {"target": {}}
    target_all: dict = {}
    for v, chunk in enumerate(trainer.chunks):
        sd = _prefixed(chunk.sharded_state_dict(prefix=""), "target.")
        out["target"][f"chunk{v}"] = sd
        target_all[f"chunk{v}"] = sd
    out["target_optimizer"] = _optimizer_sharded(trainer.optimizer, target_all, "optimizer.")
    if trainer.draft is not None:
        out["draft"] = _prefixed(trainer.draft.sharded_state_dict(prefix=""), "draft.")
        if draft_optimizer:
            out["draft_optimizer"] = _optimizer_sharded(trainer.draft_optimizer, out["draft"], "optimizer.")
    if rng:
        rank, world = dist.get_rank(), dist.get_world_size()
        out["rng"] = ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0)
    return out


def save(ctx: RankContext, trainer, step: int) -> Path:
    """Every rank: write the state after ``step`` completed steps to RUN_DIR/checkpoints/step-<step>/; rank 0 then
    copies metrics rows 0..step-1 in, writes the completion marker and prunes. Returns the folder."""
    import psutil  # noqa: F401 - the writer's forked processes need it and would hang the save without it
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    started = time.perf_counter()
    folder = files.step_dir(ctx.run_dir, step)
    steps = torch.tensor([optimizer_step(trainer.optimizer),
                          optimizer_step(trainer.draft_optimizer) if trainer.draft is not None else 0],
                         dtype=torch.float64, device=trainer.device)
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # the draft's step lives only on the draft's ranks
    target_step, draft_step = (int(x) for x in steps.tolist())
    meta = {**files.describe(ctx.plan), "step": step, "target_optimizer_step": target_step,
            "draft_optimizer_step": draft_step}
    if ctx.global_rank == 0:
        if folder.exists():  # a leftover of an abandoned future (a resume from an older step): replace it
            files.remove(folder)
        folder.mkdir(parents=True)
    dist.barrier()
    state = sharded_state(trainer, rng=True, draft_optimizer=draft_step > 0)
    state["meta"] = meta  # common (rank 0 writes it); identical on every rank
    with _quiet_writer():
        dist_checkpointing.save(state, str(folder), sharded_strategy=get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    if ctx.global_rank == 0:
        rows = files.metrics_rows(ctx.metrics_path, step)
        (folder / files.METRICS).write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        files.write_marker(folder, meta)
        files.prune(ctx.run_dir, ctx.plan.spec.training.keep_checkpoints)
    dist.barrier()  # nobody leaves (a preempted job exits next) before the marker is on disk
    if ctx.global_rank == 0:
        print(f"[specdraft] saved {folder} in {time.perf_counter() - started:.2f}s", flush=True)
    return folder


def _load(trainer, folder: Path, meta: dict, rng: bool) -> None:
    from megatron.core import dist_checkpointing

    draft_optimizer = trainer.draft is not None and meta["draft_optimizer_step"] > 0
    _init_optimizer_state(trainer.optimizer, meta["target_optimizer_step"])
    if draft_optimizer:
        _init_optimizer_state(trainer.draft_optimizer, meta["draft_optimizer_step"])
    template = sharded_state(trainer, rng=rng, draft_optimizer=draft_optimizer)
    with _quiet_writer():
        loaded = dist_checkpointing.load(template, str(folder))
    for v, chunk in enumerate(trainer.chunks):
        chunk.load_state_dict(loaded["target"][f"chunk{v}"])
    _copy_optimizer(trainer.optimizer, loaded["target_optimizer"])
    if trainer.draft is not None:
        trainer.draft.load_state_dict(loaded["draft"])
        if draft_optimizer:
            _copy_optimizer(trainer.draft_optimizer, loaded["draft_optimizer"])
        else:
            trainer.draft_optimizer.state.clear()
    if rng:
        _set_rng_state(loaded["rng"])


def _copy_optimizer(optimizer: torch.optim.Optimizer, loaded: dict) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, param in enumerate(params):
        for name in ADAM_STATE:
            optimizer.state[param][name].copy_(loaded[f"{name}.{i}"])


def restore(ctx: RankContext, trainer) -> tuple[int, dict]:
    """Resume as ctx asks: load the chosen checkpoint on every rank, rewrite metrics.jsonl to its step (rank 0,
    atomically). Returns (first step to run, what to record in the result). No resume: (0, {})."""
    # torch's DCP raises CheckpointException, a BaseException, for a checkpoint it cannot read.
    from torch.distributed.checkpoint.api import CheckpointException

    if ctx.resume is None:
        return 0, {}
    choice: list = [None]
    if ctx.global_rank == 0:
        try:
            choice[0] = ("ok", files.choose(ctx.run_dir, ctx.plan, ctx.resume, ctx.resume_from, _warn))
        except files.ResumeError as err:
            choice[0] = ("error", str(err))
    dist.broadcast_object_list(choice, src=0)  # one decision, the same on every rank
    kind, value = choice[0]
    if kind == "error":
        raise files.ResumeError(value)
    skipped = []
    for folder, meta in value:
        rng = files.same_layout(meta, ctx.plan)
        error = ""
        try:
            _load(trainer, folder, meta, rng)
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - all ranks agree first; reported below
            error = f"{type(err).__name__}: {err}"
        failed = torch.tensor([1.0 if error else 0.0], device=trainer.device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if not failed.item():
            break
        if error:
            print(f"[specdraft] rank {ctx.global_rank}: loading {folder} failed: {error[:2000]}", file=sys.stderr,
                  flush=True)
        skipped.append(str(folder))
        if ctx.global_rank == 0:
            _warn(f"skipping checkpoint {folder}: it could not be loaded (see the ranks' errors above)")
    else:
        if value:
            raise files.ResumeError(f"no checkpoint could be loaded (tried {', '.join(skipped)}); see the ranks' "
                                    "errors above")
        if ctx.global_rank == 0:  # a requeued job that never saved starts over: its old rows go
            files.rewrite_metrics(ctx.run_dir, [])
        dist.barrier()
        return 0, {"resumed_from": None}
    step = int(meta["step"])
    if ctx.global_rank == 0:
        files.rewrite_metrics(ctx.run_dir, files.metrics_rows(folder / files.METRICS, step))
        print(f"[specdraft] resumed from {folder} (step {step}, "
              f"{'same layout' if rng else 'saved under another layout: resharded, RNG streams not carried'})",
              flush=True)
    dist.barrier()
    return step, {"resumed_from": str(folder), "resumed_step": step, "skipped_checkpoints": skipped}


def _warn(message: str) -> None:
    print(f"[specdraft] warning: {message}", file=sys.stderr, flush=True)
