"""The draft as an EAGLE-3 checkpoint for vLLM and SGLang: from a run's checkpoint (`specdraft export`, this module's
`python -m` payload), or published from the live draft every draft.export_interval steps into RUN_DIR/draft/step-N/.
With --policy, the policy instead, as a Hugging Face checkpoint (models/hf/export.py).

From a checkpoint, dist_checkpointing loads the draft's TP shards into an unsharded template on one process
(offline.py). While training, the draft ranks of data/context rank 0 all-gather their TP shards and the tp-rank-0
one writes; either way eagle3_format.write makes the folder appear whole.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdraft.runs.paths import DRAFTS, RunPaths
from specdraft.runtime.folders import check_export_target


def published_dir(run_dir: Path, step: int) -> Path:
    """RUN_DIR/draft/step-N/: the versioned drafts a rollout engine reloads between RL steps; refused (LinkOut) when
    draft/ is a link, which would send the write out of the run folder."""
    paths = RunPaths(run_dir)
    paths.real_dir(DRAFTS)
    return paths.published(step)


def export_checkpoint(run_dir: Path, step: int | None, output: Path, plan_sha256: str | None = None) -> dict:
    """Write the draft of ``run_dir``'s checkpoint at ``step`` (the newest when None) to ``output``; with
    ``plan_sha256``, plan.json must be the bytes the CLI verified."""
    from specdraft.runtime.serve import offline

    plan = offline.read_run_plan(run_dir, plan_sha256)
    offline.require_draft(plan, run_dir)
    offline.require_one_layer(plan)  # both refusals before torch is imported
    check_export_target(output)
    folder, meta = offline.checkpoint(run_dir, step)
    offline.require_same_model(plan, folder, meta)
    from specdraft.runtime.serve import eagle3 as eagle3_format  # torch: only once the inputs passed

    with offline.single_process():
        written = draft_to(output, plan, folder, meta)
    return {
        "output": str(written),
        "step": int(meta["step"]),
        "checkpoint": str(folder),
        "tensors": eagle3_format.num_tensors(written),
        "draft_vocab_size": plan.draft.vocab_size,
        "vocab_size": plan.model.vocab_size,
    }


def export_policy(
    run_dir: Path, step: int | None, output: Path, max_shard_bytes: int | None = None, plan_sha256: str | None = None
) -> dict:
    """Write the policy of ``run_dir``'s checkpoint at ``step`` (the newest when None) to ``output`` as a HF folder.

    Loaded on the CPU in the export's dtype (the input checkpoint's, else the run's), so an fp32 or bf16 import
    round-trips exactly; safetensors shards of at most ``max_shard_bytes`` (default 5 GB). With ``plan_sha256``,
    plan.json must be the bytes the CLI verified."""
    from specdraft.runtime.serve import offline

    plan = offline.read_run_plan(run_dir, plan_sha256)
    check_export_target(output)
    folder, meta = offline.checkpoint(run_dir, step)
    with offline.single_process():
        written = policy_to(output, plan, folder, meta, max_shard_bytes=max_shard_bytes)
    return {"output": str(output), "step": int(meta["step"]), "checkpoint": str(folder), **written}


def draft_to(output: Path, plan, folder: Path, meta: dict, provenance: dict | None = None) -> Path:
    """The draft of checkpoint ``folder`` (its checked marker ``meta``) written to ``output`` as EAGLE-3; inside
    offline.single_process(). ``provenance`` adds to the export's marker."""
    from specdraft.runtime.serve import eagle3 as eagle3_format
    from specdraft.runtime.serve import offline

    _, draft = offline.load(plan, folder, target=False, meta=meta)
    record = {
        "source": "checkpoint",
        "checkpoint": str(folder),
        "step": int(meta["step"]),
        "draft_optimizer_step": int(meta.get("draft_optimizer_step", 0)),
        **(provenance or {}),
    }
    return eagle3_format.write(output, plan, draft.state_dict(), record)


def policy_to(
    output: Path, plan, folder: Path, meta: dict, max_shard_bytes: int | None = None, provenance: dict | None = None
) -> dict:
    """The policy of checkpoint ``folder`` written to ``output`` as a HF checkpoint (loaded on the CPU in the
    export's dtype); inside offline.single_process(). Returns what hf export wrote."""
    import torch

    from specdraft.runtime.models.hf import export as hf_export
    from specdraft.runtime.serve import offline

    dtype = hf_export.export_dtype(plan)
    target, _ = offline.load(plan, folder, draft=False, device=torch.device("cpu"), dtype=dtype, meta=meta)
    return hf_export.write(
        output,
        plan,
        target.state_dict(),
        {"source": "checkpoint", "checkpoint": str(folder), "step": int(meta["step"]), **(provenance or {})},
        max_shard_bytes=max_shard_bytes or hf_export.MAX_SHARD_BYTES,
    )


def whole_draft_state(trainer) -> dict:
    """Every rank of the draft's TP group: the draft's state dict with its TP-split parameters all-gathered."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group() if trainer.tp > 1 else None
    params = dict(trainer.draft.named_parameters())
    state = {}
    for name, value in trainer.draft.state_dict().items():
        param = params.get(name)
        if group is not None and param is not None and getattr(param, "tensor_model_parallel", False):
            parts = [torch.empty_like(value) for _ in range(trainer.tp)]
            dist.all_gather(parts, value.contiguous(), group=group)
            value = torch.cat(parts, dim=param.partition_dim)
        state[name] = value
    return state


def publish(ctx, trainer, step: int) -> Path | None:
    """Every draft rank: gather the draft's TP shards on the (dp, cp) = 0 ranks; tp rank 0 writes
    RUN_DIR/draft/step-<step>/. Returns the folder on the writing rank, else None."""
    from megatron.core import parallel_state as ps

    from specdraft.runtime.serve import eagle3 as eagle3_format

    if trainer.draft is None or ctx.coords.dp != 0 or ctx.coords.cp != 0:
        return None
    state = whole_draft_state(trainer)
    if ps.get_tensor_model_parallel_rank() != 0:
        return None
    folder = published_dir(ctx.run_dir, step)
    return eagle3_format.write(folder, ctx.plan, state, {"source": "training", "step": step})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdraft.runtime.serve.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run", type=Path, help="the run folder")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest complete one)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the folder to write")
    parser.add_argument("--plan-sha256", required=True, help="sha256 of the plan.json the CLI verified")
    parser.add_argument("--policy", action="store_true", help="the policy as a Hugging Face checkpoint, not the draft")
    parser.add_argument("--max-shard-bytes", type=int, default=None, help="--policy: the largest safetensors shard")
    args = parser.parse_args(argv)
    from specdraft.runtime.tool import run_tool

    if args.policy:
        return run_tool(
            lambda: export_policy(
                args.run.absolute(), args.step, args.output.absolute(), args.max_shard_bytes, args.plan_sha256
            )
        )
    return run_tool(lambda: export_checkpoint(args.run.absolute(), args.step, args.output.absolute(), args.plan_sha256))


if __name__ == "__main__":
    from specdraft.runtime.tool import exit_now

    exit_now(main())
