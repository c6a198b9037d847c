"""The live policy and draft gathered to global rank 0 in memory (one flat send per rank and refit), in the rollout
engine's names: the policy as HF tensors (every rank's tp/pp/ep shard mapped with hf/mapping.source, the inverse of
hf/load.py), the draft as EAGLE-3 tensors (serve/eagle3.py); and the HF folders the engine starts from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from specdraft.runtime.models import moe
from specdraft.runtime.models.hf import export as hf_export
from specdraft.runtime.models.hf import mapping
from specdraft.runtime.models.hf.checkpoint import FAMILIES, geometry
from specdraft.runtime.rl import flat

# One slice of an HF tensor a rank sends: HF name, rows, cols, the live parameter, and its rows [at, at + n).
Slice = tuple[str, Optional[tuple[int, int]], Optional[tuple[int, int]], torch.Tensor, int, int]
# What rank 0 knows of a sender's buffer: (name, rows, cols, shape, dtype) per tensor, in packing order.
Meta = tuple[str, Optional[tuple[int, int]], Optional[tuple[int, int]], tuple[int, ...], torch.dtype]


def _policy_slices(trainer) -> list[Slice]:
    """Every slice of an HF tensor this rank holds and is the one to send."""
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
                out.append((piece.name, piece.rows, piece.cols, param, at, rows))
                at += rows
    return out


def _unpack(buffer: torch.Tensor, metas: list[Meta]) -> Iterator[tuple]:
    """(name, rows, cols, tensor) per entry of a buffer flat.pack made; tensors are views of the CPU buffer."""
    tensors = flat.views(buffer.cpu(), [(shape, dtype) for *_, shape, dtype in metas])
    for (name, rows, cols, _, _), tensor in zip(metas, tensors):
        yield name, rows, cols, tensor


class Gather:
    """The policy and draft of every rank gathered to global rank 0. Which rank sends which tensors, and their
    shapes, are fixed by the layout: they are exchanged once (a pickled gather), after which a refit is one
    flat send per sending rank (gloo here, NCCL on GPUs), and none at all in one process."""

    def __init__(self, trainer, dst: int = 0):
        self.trainer, self.dst = trainer, dst
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dtype = hf_export.export_dtype(trainer.plan)
        self.slices = _policy_slices(trainer)
        self.policy_metas = self._exchange(
            [(name, rows, cols, (n, *param.shape[1:]), self.dtype) for name, rows, cols, param, _, n in self.slices]
        )
        self.draft_metas: list[list[Meta]] | None = None

    def _exchange(self, metas: list[Meta]) -> list[list[Meta]]:
        """Every rank: rank 0 gets each rank's list of what it sends (elsewhere: an empty list)."""
        received: Any = [None] * self.world if self.rank == self.dst else None
        dist.gather_object(metas, received, dst=self.dst)
        return received or []

    def _collect(self, own: list[torch.Tensor], metas: list[list[Meta]]) -> list[tuple]:
        """Every rank: send ``own`` to rank 0; rank 0 gets (name, rows, cols, tensor) of every rank's tensors."""
        device = self.trainer.device
        if self.rank != self.dst:
            if own:
                dist.send(flat.pack(own, device), dst=self.dst)
            return []
        out: list[tuple] = []
        for rank, rank_metas in enumerate(metas):
            if rank == self.dst:
                out += [(m[0], m[1], m[2], t) for m, t in zip(rank_metas, own)]
            elif rank_metas:
                size = flat.num_bytes((m[3], m[4]) for m in rank_metas)
                buffer = torch.empty(size, dtype=torch.uint8, device=device)
                dist.recv(buffer, src=rank)
                out += list(_unpack(buffer, rank_metas))
        return out

    def policy(self) -> dict[str, torch.Tensor] | None:
        """Every rank: the whole policy in HF names on global rank 0 (None elsewhere), in the export's dtype."""
        own = [p.detach().narrow(0, at, n).to(self.dtype) for _, _, _, p, at, n in self.slices]
        pieces = self._collect(own, self.policy_metas)
        if self.rank != self.dst:
            return None
        plan = self.trainer.plan
        g = geometry(plan.model, FAMILIES[hf_export.policy_architecture(plan)])
        out = {name: torch.zeros(shape, dtype=self.dtype) for name, shape in mapping.hf_tensors(g).items()}
        for name, rows, cols, block in pieces:
            r0, r1 = rows or (0, out[name].shape[0])
            if cols is None:
                out[name][r0:r1] = block
            else:
                out[name][r0:r1, cols[0] : cols[1]] = block
        return out

    def draft(self) -> dict[str, torch.Tensor] | None:
        """Every rank: the draft's whole runtime state dict (its tensors) on global rank 0 (None elsewhere, or
        without a draft)."""
        trainer = self.trainer
        state: dict[str, torch.Tensor] = {}
        if trainer.draft is not None and trainer.ctx.coords.dp == 0 and trainer.cp_rank == 0:
            from specdraft.runtime.serve.export import whole_draft_state

            state = {
                k: v
                for k, v in whole_draft_state(trainer).items()
                if isinstance(v, torch.Tensor) and not k.endswith("._extra_state")  # TE's fp8 metadata: no weight
            }
            if trainer.ps.get_tensor_model_parallel_rank() != 0:
                state = {}
        if self.draft_metas is None:
            self.draft_metas = self._exchange([(k, None, None, tuple(v.shape), v.dtype) for k, v in state.items()])
        pieces = self._collect(list(state.values()), self.draft_metas)
        if self.rank != self.dst:
            return None
        # a copy: the trainer's parameters move on while the engine holds these
        out = {name: t.detach().cpu().clone() for name, _, _, t in pieces}
        return out or None


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
