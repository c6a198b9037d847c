"""One process, whole models: a run's target (megatron GPTModel) and draft loaded from one of its checkpoints.

dist_checkpointing reshards whatever layout wrote the checkpoint into unsharded templates built at tp = cp = pp = 1
(the same mechanism as a resume under another layout), so nothing here reassembles shards by hand. Used by
`specdraft export` and `specdraft rollout measure` (each a `python -m` payload of its own) and by benchmarks. torch
is imported only where a model is built, so refusals (no draft, no such checkpoint) come back at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path

from specdraft.errors import SpecdraftError
from specdraft.plan.model import ChunkPlan, LaunchPlan, RankPlacement, StagePlan
from specdraft.runs import checkpoints as files

EXPORT_MARKER = "specdraft-export.json"  # an export's provenance file; also what makes a folder safe to replace


class LoadError(SpecdraftError):
    """A run folder or checkpoint that cannot give what was asked (the user's to fix: exit 2)."""

    def __init__(self, message: str, fix: str = ""):
        self.message, self.fix = message, fix
        super().__init__(message)


class ExportError(LoadError):
    """A draft or an output folder the EAGLE-3 export cannot take (more than one decoder layer, a foreign folder)."""


def read_run_plan(run_dir: Path) -> LaunchPlan:
    from specdraft.runtime.entry import read_plan

    path = Path(run_dir) / "plan.json"
    if not path.is_file():
        raise LoadError(
            f"{run_dir} has no plan.json: it is not a specdraft run folder",
            "name a run folder that `specdraft launch` created",
        )
    return read_plan(path)


def require_draft(plan: LaunchPlan, run_dir: Path) -> None:
    if not plan.draft.enabled:
        raise LoadError(
            f"run {run_dir} trained no draft (draft.enabled is false in its plan)",
            "export or measure a run launched with draft.enabled=true",
        )


def require_one_layer(plan: LaunchPlan) -> None:
    """EAGLE-3 as vLLM and SGLang load it has one decoder layer (`midlayer`)."""
    if plan.spec.draft.num_layers != 1:
        raise ExportError(
            f"draft.num_layers is {plan.spec.draft.num_layers}; the EAGLE-3 format vLLM and SGLang load "
            "has one decoder layer (`midlayer`)",
            "export a run whose draft has one layer",
        )


def check_export_target(folder: Path) -> None:
    """An export replaces an earlier specdraft export or fills an empty folder; anything else there is refused."""
    folder = Path(folder)
    empty = folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())
    if folder.exists() and not (folder / EXPORT_MARKER).is_file() and not empty:
        raise ExportError(
            f"{folder} exists and is not a specdraft export; refusing to replace it",
            "pick another -o folder (an earlier specdraft export there is replaced)",
        )


def checkpoint(run_dir: Path, step: int | None, option: str = "--step") -> tuple[Path, dict]:
    """The complete checkpoint of ``run_dir`` at ``step`` (the newest when None), with its marker."""
    found = files.complete_checkpoints(Path(run_dir), lambda message: None)
    if not found:
        raise LoadError(
            f"run {run_dir} has no complete checkpoint in {files.checkpoints_root(run_dir)}",
            "launch it with training.save_interval=N (a stop signal also saves one)",
        )
    if step is None:
        return found[0]
    for folder, meta in found:
        if int(meta["step"]) == step:
            return folder, meta
    have = ", ".join(str(meta["step"]) for _, meta in reversed(found))
    raise LoadError(
        f"{option} {step}: run {run_dir} has no complete checkpoint at step {step} (it has steps {have})",
        f"use {option} with one of {have}",
    )


def single_plan(plan: LaunchPlan) -> LaunchPlan:
    """``plan``'s model and draft on one process: tp = cp = pp = dp = 1, one stage holding every layer."""
    n = plan.model.num_layers
    spec = plan.spec
    spec_parallel = dataclasses.replace(
        spec.parallel,
        tp=1,
        cp=1,
        pp=1,
        dp=1,
        ep=1,
        etp=None,
        vpp=None,
        sequence_parallel=False,
        first_stage_layers=None,
        last_stage_layers=None,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
        hierarchical_cp_sizes=None,
    )
    parallel = dataclasses.replace(
        plan.parallel,
        tp=1,
        cp=1,
        pp=1,
        dp=1,
        ep=1,
        etp=1,
        edp=1,
        vpp=None,
        sequence_parallel=False,
        hierarchical_cp_sizes=None,
        pad_multiple=2,
    )
    stage = StagePlan(
        pp=0,
        first_layer=0,
        last_layer=n - 1,
        num_layers=n,
        chunks=(ChunkPlan(vpp=0, first_layer=0, last_layer=n - 1, num_layers=n),),
    )
    rank = RankPlacement(global_rank=0, node=0, local_rank=0, tp=0, cp=0, dp=0, pp=0, ep=0, etp=0, edp=0)
    draft = dataclasses.replace(plan.draft, stage=0, ranks=(0,))
    return dataclasses.replace(
        plan,
        spec=dataclasses.replace(spec, parallel=spec_parallel),
        parallel=parallel,
        world_size=1,
        num_microbatches=1,
        ranks=(rank,),
        stages=(stage,),
        draft=draft,
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
        t = plan.spec.training.dtype
        return torch.device("cuda:0"), torch.float32 if t == "fp32" else torch.bfloat16
    return torch.device("cpu"), torch.float32


def load(plan: LaunchPlan, folder: Path, *, target: bool = True, draft: bool = True, device=None, dtype=None):
    """(target GPTModel or None, Eagle3Draft or None) of ``plan``'s run, unsharded, with ``folder``'s weights.

    Call inside `single_process()`. The draft carries its vocabulary mapping (d2t/t2d) from the checkpoint.
    """
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    from specdraft.runtime.models.draft import Eagle3Draft, draft_shape
    from specdraft.runtime.models.target import build_chunks, transformer_config
    from specdraft.runtime.train.checkpoint import _prefixed, _quiet_writer

    one = single_plan(plan)
    if device is None or dtype is None:
        device, dtype = device_and_dtype(plan)
    seed = plan.spec.training.seed
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
        with _quiet_writer():
            loaded = dist_checkpointing.load(template, str(folder))
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


def run_tool(work) -> int:
    """The offline tools' shared main: megatron's warnings quieted, the result as one JSON line on stdout, a LoadError
    as the one-line payload error the CLI shows (exit 2)."""
    import json
    import sys
    import warnings

    from specdraft.errors import payload_error_line
    from specdraft.runtime.models.hf.checkpoint import CheckpointError

    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")  # config deprecations, TE absent
    try:
        result = work()
    except (LoadError, CheckpointError) as err:  # ExportError too
        print(payload_error_line(err.message, err.fix), file=sys.stderr, flush=True)
        return 2
    print(json.dumps(result), flush=True)
    return 0
