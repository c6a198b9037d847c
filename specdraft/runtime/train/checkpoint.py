"""Sharded checkpoints of one co-training run with megatron-core's dist_checkpointing (torch_dist format).

What a checkpoint holds, each rank writing only its shards: the target chunks (`model.sharded_state_dict()`: keyed by
global layer and parameter name, with TP partition info), the draft (Eagle3Draft.sharded_state_dict), both AdamW
optimizers (exp_avg, exp_avg_sq and, for bf16/fp16 parameters, the fp32 main weight as ShardedTensors keyed and
partitioned exactly like their parameter, so they reshard with it; under the distributed optimizer each is written
by the rank that owns it; the step count, shared by every parameter, and the fp16 loss scale in the common part),
the data position (the step index: data.py derives every batch from it; for a data file also the next sample's
epoch and index, packing.py, restored on resume) and every RNG state (torch CPU; on a CUDA
device also CUDA's and megatron's CUDA RNG tracker; per global rank, restored only under the same layout). The
learning rate is constant (no schedule to save). On-disk layout, markers and the choice of checkpoint:
runs/checkpoints.py; every file's sha256 goes into the marker (each rank hashes a share) and is checked before a
resume loads it; the load itself is runtime/train/safe_load.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from specdraft.runs import checkpoints as files
from specdraft.runs.marker import CorruptCheckpoint, check_hashes, hash_files, manifest_files
from specdraft.runs.paths import CHECKPOINTS
from specdraft.runtime.context import RankContext
from specdraft.runtime.train.safe_load import quiet_writer

ADAM_STATE = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter tensors (amsgrad off); "step" is shared
MAIN = "fp32_param"  # the fp32 main weight of a bf16/fp16 parameter (megatron's name for it)


def _prefixed(sharded: dict, prefix: str) -> dict:
    """Prefix every ShardedTensor/Factory/Object key in place: dict keys stay the module's own (load_state_dict
    needs them), while the checkpoint's global names say whose tensor it is ("target.", "draft.")."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values

    for value in nested_values(sharded):
        value.key = prefix + value.key
    return sharded


def _optimizer_sharded(opt, model_sharded: dict, prefix: str, mains: bool = True) -> dict:
    """exp_avg/exp_avg_sq (and the fp32 main weight) of every parameter this rank steps (precision.MainOptimizer's
    `owned`) as ShardedTensors shaped and keyed like the parameter itself.

    The parameter -> ShardedTensor match is by identity (the model's sharded dict holds the Parameters), the way
    megatron-core's own optimizers do it (dist_checkpointing.optimizer); SwiGLU's fused fc1 comes through its
    ShardedTensorFactory, which splits gate and up again so the state reshards across tp like the weight. A state
    the distributed optimizer sharded exists only on its owner, which writes it as the main replica.
    """
    from dataclasses import replace

    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        make_sharded_optimizer_tensor,
    )

    if opt.optimizer is None:
        return {}
    by_id = get_param_id_to_sharded_param_map(model_sharded, opt.owned)
    missing = [i for i in range(len(opt.owned)) if i not in by_id]
    if missing:
        raise RuntimeError(
            f"{len(missing)} optimizer parameter(s) have no entry in the model's sharded state dict "
            f"(first: shape {tuple(opt.owned[missing[0]].shape)}); they could not be checkpointed"
        )
    out = {}
    for i, (param, main) in enumerate(zip(opt.owned, opt.main)):
        model = by_id[i]
        if opt.is_sharded(param):
            model = replace(model, replica_id=_owner_replica(model.replica_id))
        state = opt.optimizer.state[main]
        for name in ADAM_STATE:
            out[f"{name}.{i}"] = make_sharded_optimizer_tensor(model, state[name], prefix=f"{prefix}{name}")
        if main is not param and mains:
            out[f"{MAIN}.{i}"] = make_sharded_optimizer_tensor(model, main.data, prefix=f"{prefix}{MAIN}")
    return out


def _owner_replica(replica_id):
    """The model tensor's replica id with its data-parallel coordinate (the last one, megatron's dp x cp or expert
    dp rank) set to 0: the owner writes the main replica; the other ranks of the group hold no copy at all."""
    return (*replica_id[:-1], 0) if isinstance(replica_id, tuple) else 0


def optimizer_step(opt) -> int:
    """AdamW's step count, which every parameter shares here (0 before the first step or with nothing owned)."""
    optimizer = opt.optimizer if opt is not None else None
    if optimizer is None:
        return 0
    steps = {float(s["step"]) for s in optimizer.state.values() if "step" in s}
    if len(steps) > 1:
        raise RuntimeError(
            f"the optimizer's parameters are at different steps {sorted(steps)}; a checkpoint stores one shared step"
        )
    if steps and len(optimizer.state) != sum(len(g["params"]) for g in optimizer.param_groups):
        raise RuntimeError("some optimizer parameters have state and others none; a checkpoint cannot say which")
    return int(steps.pop()) if steps else 0


def _init_optimizer_state(opt, step: int) -> None:
    """Fresh state tensors for loading into, with AdamW's own step representation (a float32 scalar tensor, on the
    parameter's device for the fused CUDA AdamW)."""
    if opt.optimizer is None:
        return
    for group in opt.optimizer.param_groups:
        for param in group["params"]:
            where = param.device if group.get("fused") or group.get("capturable") else "cpu"
            opt.optimizer.state[param] = {
                "step": torch.tensor(float(step), dtype=torch.float32, device=where),
                **{name: torch.zeros_like(param) for name in ADAM_STATE},
            }


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":  # megatron's tracker holds states only after model_parallel_cuda_manual_seed (GPU)
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        state["cuda"] = torch.cuda.get_rng_state(device)
        state["tracker"] = get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        torch.cuda.set_rng_state(state["cuda"], device)
        get_cuda_rng_tracker().set_states(state["tracker"])


def sharded_state(
    trainer, *, rng: bool, draft_optimizer: bool, mains: bool = True, reference_per_rank: bool = False
) -> dict:
    """This rank's part of the checkpoint as a sharded state dict (the template to load into, too).
    ``reference_per_rank``: a checkpoint of an older specdraft, whose GRPO reference is each rank's own object."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    out: dict = {"target": {}}
    target_all: dict = {}
    for v, chunk in enumerate(trainer.chunks):
        sd = _prefixed(chunk.sharded_state_dict(prefix=""), "target.")
        out["target"][f"chunk{v}"] = sd
        target_all[f"chunk{v}"] = sd
    out["target_optimizer"] = _optimizer_sharded(trainer.optimizer, target_all, "optimizer.", mains)
    if trainer.draft is not None:
        out["draft"] = _prefixed(trainer.draft.sharded_state_dict(prefix=""), "draft.")
        if draft_optimizer:
            out["draft_optimizer"] = _optimizer_sharded(trainer.draft_optimizer, out["draft"], "optimizer.", mains)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rng:
        out["rng"] = ShardedObject("rng_state", _rng_state(trainer.device), (world,), (rank,), replica_id=0)
    reference = getattr(trainer, "reference", None)  # GRPO's frozen reference policy
    if reference is not None and reference_per_rank:
        out["reference"] = ShardedObject(
            "grpo_reference", [r.cpu() for r in reference], (world,), (rank,), replica_id=0
        )
    elif reference is not None:
        out["reference"] = _reference_sharded(trainer, reference, target_all)
    return out


def _reference_sharded(trainer, reference: list, model_sharded: dict) -> dict:
    """The reference's tensors sharded, keyed and replicated like the parameters they copy (the way optimizer state
    is, SwiGLU's factory included), so a reference reshards into another layout with the policy."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        make_sharded_optimizer_tensor,
    )

    params = list(trainer.target_params.all())
    by_id = get_param_id_to_sharded_param_map(model_sharded, params)
    if len(by_id) != len(params):
        raise RuntimeError(
            f"{len(params) - len(by_id)} policy parameter(s) have no entry in the model's sharded state dict; the "
            "GRPO reference could not be checkpointed"
        )
    return {f"ref.{i}": make_sharded_optimizer_tensor(by_id[i], r, prefix="reference") for i, r in enumerate(reference)}


def save(ctx: RankContext, trainer, step: int, extra=None) -> Path:
    """Every rank: write the state after ``step`` completed steps to RUN_DIR/checkpoints/step-<step>/; rank 0 then
    copies metrics rows 0..step-1 in, runs ``extra(folder)`` (a workload's own files, hashed with the rest), writes
    the completion marker and prunes. Returns the folder."""
    import psutil  # noqa: F401 - the writer's forked processes need it and would hang the save without it
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    started = time.perf_counter()
    folder = ctx.paths.step(step)
    steps = torch.tensor(
        [
            optimizer_step(trainer.optimizer),
            optimizer_step(trainer.draft_optimizer) if trainer.draft is not None else 0,
        ],
        dtype=torch.float64,
        device=trainer.device,
    )
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # the draft's step lives only on the draft's ranks
    target_step, draft_step = (int(x) for x in steps.tolist())
    meta = {
        **files.describe(ctx.plan),
        "step": step,
        "target_optimizer_step": target_step,
        "draft_optimizer_step": draft_step,
        "main_weights": trainer.precision.main_weights,
        "loss_scale": trainer.loss_scaler.state() if trainer.loss_scaler is not None else None,
        "data": trainer.data.position(step),
        # how the GRPO reference is stored: "sharded" like the policy (older checkpoints: each rank's own object)
        "reference": "sharded" if getattr(trainer, "reference", None) is not None else None,
    }
    if ctx.global_rank == 0:
        ctx.paths.real_dir(CHECKPOINTS)  # a link in its place would send the save out of the run folder
        if os.path.lexists(folder):  # a leftover of an abandoned future (a resume from an older step): replace it
            files.remove(folder, ctx.paths)
        folder.mkdir(parents=True)
    dist.barrier()
    state = sharded_state(trainer, rng=True, draft_optimizer=draft_step > 0)
    state["meta"] = meta  # common (rank 0 writes it); identical on every rank
    with quiet_writer():
        dist_checkpointing.save(state, str(folder), sharded_strategy=get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    names: list = [None]
    if ctx.global_rank == 0:
        files.write_metrics(folder, files.metrics_rows(ctx.run_dir, step))
        if extra is not None:
            extra(folder)
        names[0] = manifest_files(folder)
    dist.broadcast_object_list(names, src=0)
    # Every rank hashes a share of the files (a checkpoint is read once, in parallel), rank 0 writes them all.
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, hash_files(folder, names[0][ctx.global_rank :: dist.get_world_size()]))
    if ctx.global_rank == 0:
        files.write_marker(folder, meta, {rel: entry for share in shares for rel, entry in share.items()})
        files.prune(ctx.run_dir, ctx.plan.training.keep_checkpoints)
    dist.barrier()  # nobody leaves (a preempted job exits next) before the marker is on disk
    if ctx.global_rank == 0:
        print(f"[specdraft] saved {folder} in {time.perf_counter() - started:.2f}s", flush=True)
    return folder


def _load(trainer, folder: Path, meta: dict, rng: bool) -> None:
    from specdraft.runtime.train import safe_load

    draft_optimizer = trainer.draft is not None and meta["draft_optimizer_step"] > 0
    # fp32 main weights come from the checkpoint when it has them (a bf16/fp16 run), else from the loaded weights.
    mains = bool(meta.get("main_weights"))
    _init_optimizer_state(trainer.optimizer, meta["target_optimizer_step"])
    if draft_optimizer:
        _init_optimizer_state(trainer.draft_optimizer, meta["draft_optimizer_step"])
    per_rank = meta.get("reference") != "sharded"
    template = sharded_state(
        trainer, rng=rng, draft_optimizer=draft_optimizer, mains=mains, reference_per_rank=per_rank
    )
    loaded = safe_load.load(template, folder, meta)
    for v, chunk in enumerate(trainer.chunks):
        chunk.load_state_dict(loaded["target"][f"chunk{v}"])
    _copy_optimizer(trainer.optimizer, loaded["target_optimizer"])
    if trainer.draft is not None:
        trainer.draft.load_state_dict(loaded["draft"])
        if draft_optimizer:
            _copy_optimizer(trainer.draft_optimizer, loaded["draft_optimizer"])
        else:
            trainer.draft_optimizer.optimizer.state.clear()
            _copy_optimizer(trainer.draft_optimizer, {})
    if trainer.loss_scaler is not None and meta.get("loss_scale"):
        trainer.loss_scaler.load(meta["loss_scale"])
    if rng:
        _set_rng_state(loaded["rng"], trainer.device)
    if "reference" in loaded:
        saved_reference = loaded["reference"]
        if isinstance(saved_reference, dict):
            saved_reference = [saved_reference[f"ref.{i}"] for i in range(len(trainer.reference))]
        with torch.no_grad():
            for r, saved in zip(trainer.reference, saved_reference):
                r.copy_(saved)


@torch.no_grad()
def _copy_optimizer(opt, loaded: dict) -> None:
    """AdamW state (and fp32 main weights) from ``loaded``; a main weight the checkpoint lacks is the parameter's
    loaded value."""
    for i, (param, main) in enumerate(zip(opt.owned, opt.main)):
        for name in ADAM_STATE:
            if f"{name}.{i}" in loaded:
                opt.optimizer.state[main][name].copy_(loaded[f"{name}.{i}"])
        if main is not param:
            main.copy_(loaded[f"{MAIN}.{i}"] if f"{MAIN}.{i}" in loaded else param)


def _verify(ctx: RankContext, folder: Path, meta: dict) -> str:
    """Every rank checks the sha256 of a share of the checkpoint's files; the first problem found (the same text
    on every rank), or "" when every file is as saved."""
    world = dist.get_world_size()
    try:
        check_hashes(folder, meta, sorted(meta["manifest"])[ctx.global_rank :: world])
        mine = ""
    except CorruptCheckpoint as why:
        mine = str(why)
    found: list = [None] * world
    dist.all_gather_object(found, mine)
    return next((f for f in found if f), "")


def _try_load(ctx: RankContext, trainer, folder: Path, meta: dict, rng: bool) -> str:
    """Load on every rank; "" when every rank loaded, else why (this rank's reason, or that a peer failed)."""
    # torch's DCP raises CheckpointException, a BaseException, for a checkpoint it cannot read.
    from torch.distributed.checkpoint.api import CheckpointException

    error = ""
    try:
        _load(trainer, folder, meta, rng)
    except CorruptCheckpoint as why:  # refused metadata (safe_load): say so as it is, on every rank
        error = str(why)
    except (Exception, CheckpointException) as err:
        error = f"{type(err).__name__}: {err}"
    failed = torch.tensor([1.0 if error else 0.0], device=trainer.device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if not failed.item():
        return ""
    if error:
        print(
            f"[specdraft] rank {ctx.global_rank}: loading {folder} failed: {error[:2000]}", file=sys.stderr, flush=True
        )
    return error or "another rank could not load it"


def restore(ctx: RankContext, trainer) -> tuple[int, dict]:
    """Resume as ctx asks: check the chosen checkpoint's content hashes and load it on every rank, rewrite
    metrics.jsonl to its step (rank 0, atomically). Returns (first step to run, what to record in the result).
    No resume: (0, {})."""
    if ctx.resume is None:
        return 0, {}

    def warn(message: str) -> None:  # what changes the run goes into the result too (entry), not only stderr
        _warn(message)
        ctx.warnings.append(message)

    choice: list = [None]
    if ctx.global_rank == 0:
        try:
            choice[0] = ("ok", files.choose(ctx.run_dir, ctx.plan, ctx.resume, ctx.resume_from, warn, ctx.steps))
        except files.ResumeError as err:
            choice[0] = ("error", str(err))
    dist.broadcast_object_list(choice, src=0)  # one decision, the same on every rank
    kind, value = choice[0]
    if kind == "error":
        raise files.ResumeError(value)
    skipped, reasons = [], []
    for folder, meta in value:
        # The same decision on every rank: each has the same data and reads the same marker.
        changed = files.data_change(meta.get("data"), trainer.data.position(0))
        if changed is not None and not ctx.allow_data_change:
            message, fix = files.data_change_refused(str(ctx.plan.data.path), folder, changed)
            raise files.ResumeError(f"{message}; fix: {fix}")
        rng = files.same_layout(meta, ctx.plan)
        why = _verify(ctx, folder, meta) or _try_load(ctx, trainer, folder, meta, rng)
        if not why:
            break
        skipped.append(str(folder))
        reasons.append(f"{folder}: {why[:600]}")
        if ctx.global_rank == 0:
            warn(f"skipping checkpoint {folder}: {why[:2000]}")
    else:
        if value:
            raise files.ResumeError(f"no checkpoint could be loaded: {'; '.join(reasons)}")
        if ctx.global_rank == 0:  # a requeued job that never saved starts over: its old rows go
            files.rewrite_metrics(ctx.run_dir, [])
            files.rewind_rollouts(ctx.run_dir, 0)
        dist.barrier()
        return 0, {"resumed_from": None}
    step = int(meta["step"])
    note = trainer.data.restore(step, meta.get("data"))
    if note and ctx.global_rank == 0:
        warn(note)
    if ctx.global_rank == 0:
        files.rewrite_metrics(ctx.run_dir, files.metrics_rows(folder, step))
        files.rewind_rollouts(ctx.run_dir, step)  # GRPO's samples of the steps the resume runs again go too
        print(
            f"[specdraft] resumed from {folder} (step {step}, "
            f"{'same layout' if rng else 'saved under another layout: resharded, RNG streams not carried'})",
            flush=True,
        )
    dist.barrier()
    return step, {"resumed_from": str(folder), "resumed_step": step, "skipped_checkpoints": skipped}


def _warn(message: str) -> None:
    print(f"[specdraft] warning: {message}", file=sys.stderr, flush=True)
