"""One process, whole models: a run's target (megatron GPTModel) and draft loaded from one of its checkpoints.

dist_checkpointing reshards whatever layout wrote the checkpoint into unsharded templates built at tp = cp = pp = 1
(the same mechanism as a resume under another layout), so nothing here reassembles shards by hand. Used by
`specdraft export` and `specdraft rollout measure` (each a `python -m` payload of its own) and by benchmarks. torch
is imported only where a model is built, so refusals (no draft, no such checkpoint) come back at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import tempfile
from pathlib import Path

from specdraft.errors import SpecdraftError
from specdraft.plan.codec import PlanFormatError
from specdraft.plan.compile import one_process_plan
from specdraft.plan.model import LaunchPlan
from specdraft.runs import checkpoints as files
from specdraft.runs import files as runfiles
from specdraft.runs.marker import MARKER, CorruptCheckpoint
from specdraft.runs.paths import MAX_PLAN_BYTES, PLAN, RunPaths, link_note, step_name
from specdraft.runtime.folders import ExportError, LoadError


def read_run_plan(run_dir: Path, sha256: str | None = None) -> LaunchPlan:
    """RUN/plan.json, read once (no link, bounded). With ``sha256`` (what the CLI verified against a fresh compile
    with assemble's reader, and passes to the payload) the bytes must be exactly those."""
    source = str(Path(run_dir) / PLAN)
    data = runfiles.read_bytes(run_dir, PLAN, MAX_PLAN_BYTES)
    if data is None:
        raise LoadError(
            f"{run_dir} has no {PLAN}: it is not a specdraft run folder",
            "name a run folder that `specdraft launch` created",
        )
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise LoadError(f"{source} changed after specdraft verified it", "run the command again")
    try:
        return LaunchPlan.from_dict(runfiles.parse_json(data, source))
    except (PlanFormatError, RecursionError) as err:
        raise LoadError(f"{source}: {str(err)[:300]}", "use the specdraft version that wrote this run folder") from None


def require_draft(plan: LaunchPlan, run_dir: Path) -> None:
    if not plan.draft.enabled:
        raise LoadError(
            f"run {run_dir} trained no draft (draft.enabled is false in its plan)",
            "export or measure a run launched with draft.enabled=true",
        )


def require_one_layer(plan: LaunchPlan) -> None:
    """EAGLE-3 as vLLM and SGLang load it has one decoder layer (`midlayer`)."""
    if plan.draft.num_layers != 1:
        raise ExportError(
            f"draft.num_layers is {plan.draft.num_layers}; the EAGLE-3 format vLLM and SGLang load "
            "has one decoder layer (`midlayer`)",
            "export a run whose draft has one layer",
        )


def checkpoint(run_dir: Path, step: int | None, option: str = "--step") -> tuple[Path, dict]:
    """The checkpoint of ``run_dir`` at ``step`` (when None, the newest with a marker), with its marker, checked in
    full: every file's sha256, no link, safe metadata. A damaged one is refused by name, never passed over for an
    older one."""
    paths = RunPaths(run_dir)
    links: list[Path] = []
    try:
        dirs = paths.step_dirs(links)
    except SpecdraftError as err:
        raise LoadError(getattr(err, "message", str(err)), getattr(err, "fix", "")) from None
    found = files.complete_checkpoints(paths.root, lambda message: None)
    have = ", ".join(str(meta["step"]) for _, meta in reversed(found)) or "none"
    if step is None:
        marked = [folder for _, folder in dirs if runfiles.size(folder, MARKER) is not None]
        if not marked:
            raise LoadError(
                f"run {run_dir} has no complete checkpoint in {paths.checkpoints}",
                "launch it with training.save_interval=N (a stop signal also saves one)",
            )
        folder = marked[0]
    else:
        link = [p for p in links if p.name == step_name(step)]
        if link:
            raise LoadError(f"{option} {step}: {link_note(link[0])}", "remove the link; copy the checkpoint instead")
        hits = [folder for n, folder in dirs if n == step]
        if not hits:
            raise LoadError(
                f"{option} {step}: run {run_dir} has no complete checkpoint at step {step} (it has steps {have})",
                f"use {option} with one of {have}",
            )
        folder = hits[0]
    try:
        return folder, files.check_checkpoint(folder, hash_limit=math.inf)
    except CorruptCheckpoint as why:
        others = ", ".join(str(meta["step"]) for other, meta in reversed(found) if other != folder)
        fix = f"use {option} with another checkpoint: {others}" if others else "it is the run's only checkpoint"
        raise LoadError(f"checkpoint {folder} cannot be used: {why}", fix) from None


def require_same_model(plan: LaunchPlan, folder: Path, meta: dict) -> None:
    """The checkpoint holds this run's model and draft shape (a checkpoint copied in from another run may not)."""
    diffs = files.shape_differences(meta, plan)
    if diffs:
        raise LoadError(
            f"checkpoint {folder} holds another model shape than its run's plan: {'; '.join(diffs)}",
            "name a checkpoint this run wrote",
        )


@contextlib.contextmanager
def single_process():
    """A gloo world of one (file rendezvous, no port) with megatron's model-parallel groups at size 1."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime import cpu_compat

    cpu_compat.apply()
    owned = not dist.is_initialized()
    with tempfile.TemporaryDirectory(prefix="specdraft-offline-") as tmp:
        if owned:
            dist.init_process_group(
                "gloo", init_method=f"file://{os.path.join(tmp, 'rendezvous')}", rank=0, world_size=1
            )
        ps.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
        try:
            yield
        finally:
            ps.destroy_model_parallel()
            if owned:
                dist.destroy_process_group()


def device_and_dtype(plan: LaunchPlan):
    """(torch device, dtype): CUDA (the first GPU) when there is one, in bf16 unless the run was fp32; else the CPU in
    fp32 (the trainer keeps the spec's dtype on CPU too; offline tools read any checkpoint at full precision)."""
    import torch

    if torch.cuda.is_available():
        t = plan.training.dtype
        return torch.device("cuda:0"), torch.float32 if t == "fp32" else torch.bfloat16
    return torch.device("cpu"), torch.float32


def load(
    plan: LaunchPlan, folder: Path, *, target: bool = True, draft: bool = True, device=None, dtype=None, meta=None
):
    """(target GPTModel or None, Eagle3Draft or None) of ``plan``'s run, unsharded, with ``folder``'s weights
    (``meta``: its checked marker; read and checked here when not given).

    Call inside `single_process()`. The draft carries its vocabulary mapping (d2t/t2d) from the checkpoint.
    """
    if meta is None:
        try:
            meta = files.check_checkpoint(Path(folder))
        except CorruptCheckpoint as why:
            raise LoadError(f"checkpoint {folder} cannot be used: {why}") from None
    from torch.distributed.checkpoint.api import CheckpointException

    from specdraft.runtime.models.draft import Eagle3Draft, draft_shape
    from specdraft.runtime.models.target import build_chunks, transformer_config
    from specdraft.runtime.train import safe_load
    from specdraft.runtime.train.checkpoint import _prefixed

    one = one_process_plan(plan)
    if device is None or dtype is None:
        device, dtype = device_and_dtype(plan)
    seed = plan.training.seed
    template: dict = {}
    model = the_draft = None
    if target:
        model = build_chunks(one, 0, device, dtype, seed)[0]
        template["target"] = {"chunk0": _prefixed(model.sharded_state_dict(prefix=""), "target.")}
    if draft:
        config = dataclasses.replace(transformer_config(one, dtype, device), sequence_parallel=False)
        the_draft = Eagle3Draft(draft_shape(one), config).to(device, dtype)
        template["draft"] = _prefixed(the_draft.sharded_state_dict(prefix=""), "draft.")
    try:
        loaded = safe_load.load(template, Path(folder), meta)
    except CorruptCheckpoint as why:
        raise LoadError(
            f"checkpoint {folder} is refused: {why}", "load only checkpoints you or your cluster wrote"
        ) from None
    except (Exception, CheckpointException) as err:
        raise LoadError(
            f"checkpoint {folder} could not be loaded into this specdraft's model: "
            f"{type(err).__name__}: {str(err)[:600]}",
            "it may predate this version's draft layout (EAGLE-3 names); export a checkpoint written by this version",
        ) from None
    if model is not None:
        model.load_state_dict(loaded["target"]["chunk0"])
        model.eval()
    if the_draft is not None:
        the_draft.load_state_dict(loaded["draft"])
        the_draft.eval()
    return model, the_draft
