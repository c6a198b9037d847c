"""The live policy and draft gathered to global rank 0 in memory, in the rollout engine's names: the policy as HF
tensors (every rank's tp/pp/ep shard mapped with hf/mapping.source, the inverse of hf/load.py), the draft as
EAGLE-3 tensors (serve/eagle3.py); and the HF folders the engine starts from, written at step 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from specdraft.runtime.models import moe
from specdraft.runtime.models.hf import export as hf_export
from specdraft.runtime.models.hf import mapping
from specdraft.runtime.models.hf.checkpoint import FAMILIES, geometry

Piece = tuple[str, Optional[tuple[int, int]], Optional[tuple[int, int]], torch.Tensor]  # HF name, rows, cols, block


def _policy_pieces(trainer) -> list[Piece]:
    """(HF name, rows, cols, block) of every slice of an HF tensor this rank holds and is the one to send."""
    ps, plan = trainer.ps, trainer.plan
    g = geometry(plan.model, FAMILIES[hf_export.policy_architecture(plan)])
    tp = mapping.Shard(trainer.tp, ps.get_tensor_model_parallel_rank() if trainer.tp > 1 else 0)
    dense_sender = trainer.ctx.coords.dp == 0 and trainer.cp_rank == 0
    expert_sender = plan.model.num_experts and ps.get_expert_data_parallel_rank() == 0
    wanted = mapping.hf_tensors(g)
    out = []
    for chunk, model in zip(plan.stages[trainer.pp_rank].chunks, trainer.chunks):
        local_experts = moe.num_local_experts(model)
        for name, param in model.named_parameters():
            gname, etp = mapping.global_name(name, chunk.first_layer), mapping.Shard()
            if moe.is_expert(gname):
                if not expert_sender:
                    continue
                gname, size, rank = moe.expert_parameter(gname, local_experts)
                etp = mapping.Shard(size, rank)
            elif not dense_sender:
                continue
            if gname == "output_layer.weight" and plan.model.tie_embeddings:
                continue  # a copy of the embedding, which the first stage sends
            at = 0
            for piece in mapping.source(gname, g, tp, etp).pieces:
                rows = mapping.piece_shape(piece, wanted[piece.name])[0]
                block = param.detach().narrow(0, at, rows).cpu()
                out.append((piece.name, piece.rows, piece.cols, block))
                at += rows
    return out


def gather_policy(trainer) -> dict[str, torch.Tensor] | None:
    """Every rank: the whole policy in HF names on global rank 0 (None elsewhere), in the export's dtype."""
    plan = trainer.plan
    pieces = _policy_pieces(trainer)
    world = dist.get_world_size()
    received: Any = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(pieces, received, dst=0)
    if received is None:
        return None
    g = geometry(plan.model, FAMILIES[hf_export.policy_architecture(plan)])
    dtype = hf_export.export_dtype(plan)
    out = {name: torch.zeros(shape, dtype=dtype) for name, shape in mapping.hf_tensors(g).items()}
    for rank_pieces in received:
        for name, rows, cols, block in rank_pieces:
            r0, r1 = rows or (0, out[name].shape[0])
            if cols is None:
                out[name][r0:r1] = block
            else:
                out[name][r0:r1, cols[0] : cols[1]] = block
    return out


def gather_draft(trainer) -> dict[str, torch.Tensor] | None:
    """Every rank: the draft's whole runtime state dict on global rank 0 (None elsewhere, or without a draft)."""
    state: Optional[dict[str, Any]] = None
    if trainer.draft is not None and trainer.ctx.coords.dp == 0 and trainer.cp_rank == 0:
        from specdraft.runtime.serve.export import whole_draft_state

        state = {
            name: value.detach().cpu() if isinstance(value, torch.Tensor) else value
            for name, value in whole_draft_state(trainer).items()
        }
        if trainer.ps.get_tensor_model_parallel_rank() != 0:
            state = None
    received: Any = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(state, received, dst=0)
    if received is None:
        return None
    return next((s for s in received if s is not None), None)


def eagle3_tensors(trainer, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from specdraft.runtime.serve import eagle3

    return eagle3.tensors(state, trainer.plan)


def write_policy(folder: Path, plan, tensors: dict[str, torch.Tensor], step: int) -> Path:
    """The HF folder a rollout engine starts from (config.json + model.safetensors), appearing whole."""
    import json

    from safetensors.torch import save_file

    from specdraft.runtime.serve.folder import write_folder, write_text

    config = hf_export.policy_config(plan, hf_export.export_dtype(plan))

    def fill(tmp: Path) -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        write_text(tmp / "config.json", json.dumps(config, indent=2) + "\n")

    record = {"format": "huggingface", "architecture": config["architectures"][0], "run": plan.run_name}
    write_folder(folder, fill, {**record, "spec_sha256": plan.spec_sha256, "source": "grpo", "step": step})
    return folder


def write_draft(folder: Path, plan, state: dict[str, torch.Tensor], step: int) -> Path:
    from specdraft.runtime.serve import eagle3

    return eagle3.write(folder, plan, state, {"source": "grpo", "step": step})
