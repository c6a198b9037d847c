"""The one place where megatron-core 0.16's torch.cuda calls are redirected so it runs on CPU with gloo.

`apply()` is a no-op when CUDA is available: on GPU nothing is patched. On CPU it redirects exactly these
(file:line in megatron/core, verified in shared/notes/megatron-cpu.md):
1. `torch.cuda.current_device()` -> "cpu" device. Hit by GlobalMemoryBuffer.get_tensor (utils.py:631), RoPE's
   inv_freq move (rotary_pos_embedding.py:162), the pipeline's receive buffers (p2p_communication.py:313,321) and
   dist_checkpointing's save (strategies/state_dict_saver.py:252, save_state_dict_async_finalize's failure flag).
2. `torch.cuda.synchronize()` -> no-op (p2p_communication.py:398, after batched P2P; and dist_checkpointing's
   strategies/filesystem_async.py:230, FileSystemWriterAsync.preload_tensors). With (1) and (2), checkpoints
   save and load on gloo (runtime/checkpoint.py).
3. `CudaRNGStatesTracker.fork` -> a context that just yields: it wraps every attention forward even with
   dropout 0 (dot_product_attention.py:217) and would read CUDA RNG state.
4. The schedules' `torch.zeros(..., device="cuda")` token counters (schedules.py:596,983,2138) -> CPU tensors.
5. `get_pos_emb_on_this_cp_rank` (rope_utils.py:62, pinned memory + .cuda()) -> a CPU zigzag index_select,
   replaced where rotary_pos_embedding.py imported it by name. Only matters for cp > 1 in sbhd.
6. `get_default_causal_mask` (transformer/utils.py:35, device="cuda") -> a CPU mask, also where
   fusions/fused_softmax.py imported it by name (else the redirect depends on import order).
"""

from __future__ import annotations

import contextlib
import functools

_APPLIED = False


def apply() -> bool:
    """Redirect the CUDA calls above when CUDA is absent; return True when patches are active. Idempotent."""
    global _APPLIED
    import torch

    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    cpu = torch.device("cpu")
    torch.cuda.current_device = lambda: cpu  # (1)
    torch.cuda.synchronize = lambda device=None: None  # (2)

    from megatron.core.tensor_parallel import random as mc_random

    @contextlib.contextmanager
    def _fork(self, name=None):  # (3)
        yield

    mc_random.CudaRNGStatesTracker.fork = _fork

    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _TorchWithCpuZeros(torch)  # (4)

    from megatron.core.models.common.embeddings import rope_utils, rotary_pos_embedding

    rope_utils.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank  # (5)
    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank

    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as tf_utils

    cpu_mask = functools.lru_cache()(lambda sq: torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool())
    tf_utils.get_default_causal_mask = cpu_mask  # (6)
    fused_softmax.get_default_causal_mask = cpu_mask
    _APPLIED = True
    return True


class _TorchWithCpuZeros:
    """The `torch` module as schedules.py sees it, with device="cuda" zeros made on the CPU instead."""

    def __init__(self, torch_module):
        self._torch = torch_module

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def zeros(self, *args, **kwargs):
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return self._torch.zeros(*args, **kwargs)


def _pos_emb_on_this_cp_rank(pos_emb, seq_dim, cp_group):
    """Zigzag slice of the RoPE table for this CP rank: chunks r and 2*cp-1-r (the CPU twin of megatron's)."""
    import torch

    if cp_group is None:
        raise ValueError("cp_group must be provided to get positional embedding per CP rank")
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])
