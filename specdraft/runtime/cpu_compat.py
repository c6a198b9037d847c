"""The one place where megatron-core 0.16's torch.cuda calls are redirected so it runs on CPU with gloo.

`apply(device)` is a no-op for a CUDA device: on GPU nothing is patched (there megatron's own CUDA paths run:
`tensor_parallel.model_parallel_cuda_manual_seed` is called by runtime.entry instead of (3)). For a CPU run, even
on a machine that has CUDA, it redirects exactly these
(file:line in megatron/core 0.16.1, each verified by reading that release's source):
1. `torch.cuda.current_device()` -> "cpu" device. Hit by GlobalMemoryBuffer.get_tensor (utils.py:631), RoPE's
   inv_freq move (rotary_pos_embedding.py:162), the pipeline's receive buffers (p2p_communication.py:313,321) and
   dist_checkpointing's save (strategies/state_dict_saver.py:252, save_state_dict_async_finalize's failure flag).
2. `torch.cuda.synchronize()` -> no-op (p2p_communication.py:398, after batched P2P; and dist_checkpointing's
   strategies/filesystem_async.py:230, FileSystemWriterAsync.preload_tensors). With (1) and (2), checkpoints
   save and load on gloo (runtime/train/checkpoint.py).
3. `CudaRNGStatesTracker.fork` -> a context that just yields: it wraps every attention forward even with
   dropout 0 (dot_product_attention.py:217) and would read CUDA RNG state.
4. The schedules' `torch.zeros(..., device="cuda")` token counters (schedules.py:596,983,2138) -> CPU tensors.
5. `get_pos_emb_on_this_cp_rank` (rope_utils.py:62, pinned memory + .cuda()) -> a CPU zigzag index_select,
   replaced where rotary_pos_embedding.py imported it by name. Only matters for cp > 1 in sbhd.
6. `get_default_causal_mask` (transformer/utils.py:35, device="cuda") -> a CPU mask, also where
   fusions/fused_softmax.py imported it by name (else the redirect depends on import order).
7. MoE all-to-all token dispatcher: its constructor makes a `torch.cuda.Stream()` for device-to-host copies
   (transformer/moe/token_dispatcher.py:445) and `_maybe_dtoh_and_synchronize` (token_dispatcher.py:862) copies
   the split sizes on that stream and waits on a CUDA event. On CPU the metadata already is in host memory: no
   stream, and the split sizes become numpy arrays exactly as the GPU path leaves them.
8. Uneven all-gather and reduce-scatter (tensor_parallel/mappings.py:150 and :193: `torch.distributed.all_gather`
   / `reduce_scatter` over lists of different lengths, which NCCL accepts and gloo refuses). The MoE all-to-all
   dispatcher uses them over the expert-TP group when etp > 1 (token_dispatcher.py:696,779): on CPU every part is
   padded to the longest, gathered or reduce-scattered evenly, and trimmed.
9. Tied embeddings over pp > 1: `LanguageModule.setup_embeddings_and_output_layer` moves the last stage's copy of
   the embedding with `.cuda()` before its start-up all-reduce over the embedding group (language_module.py:241-244).
   On CPU `_is_in_embd_group` answers False, which skips only that all-reduce: target.init_parameters draws both
   copies from the embedding's global name anyway (and on GPU overwrites what the all-reduce produced).
10. Activation recomputation (`tensor_parallel.checkpoint`, random.py:444-460) saves and restores the CUDA RNG
   state around the recomputed forward: on CPU there is none to save (`_get_cuda_rng_state` -> None, its setter a
   no-op); the CPU RNG state and the tracker's are still saved and restored as on GPU.
"""

from __future__ import annotations

import contextlib
import functools

_APPLIED = False


def apply(device=None) -> bool:
    """Redirect the CUDA calls above for a CPU run (``device`` "cpu"; None: when torch sees no CUDA); return True
    when patches are active. Idempotent."""
    global _APPLIED
    import torch

    if (torch.device(device).type == "cuda") if device is not None else torch.cuda.is_available():
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
    mc_random._get_cuda_rng_state = lambda *args, **kwargs: None  # (10)
    mc_random._set_cuda_rng_state = lambda *args, **kwargs: None

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

    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NO_STREAM  # (7) a set stream skips torch.cuda.Stream()
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = _dtoh_on_host

    from megatron.core.tensor_parallel import mappings

    mappings._gather_along_first_dim = _even_gather(mappings._gather_along_first_dim)  # (8)
    mappings._reduce_scatter_along_first_dim = _even_reduce_scatter(mappings._reduce_scatter_along_first_dim)

    from megatron.core.models.common.language_module.language_module import LanguageModule

    LanguageModule._is_in_embd_group = lambda self: False  # (9)
    _APPLIED = True
    return True


_NO_STREAM = object()  # never used as a stream: _dtoh_on_host replaces the only method that would


def _dtoh_on_host(self, point, tokens_per_expert=None):
    """(7) The all-to-all dispatcher's device-to-host step without CUDA streams or events."""
    import torch

    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        for name in ("input_splits", "output_splits", "output_splits_tp"):
            value = getattr(self, name)
            if torch.is_tensor(value):
                setattr(self, name, value.numpy())
    return tokens_per_expert


def _uneven(sizes) -> list[int] | None:
    """The split sizes as ints when they differ (the case gloo cannot do), else None."""
    if sizes is None:
        return None
    sizes = [int(n) for n in sizes]
    return sizes if len(set(sizes)) > 1 else None


def _even_gather(original):
    """(8) `_gather_along_first_dim` with uneven `output_split_sizes` as one even all-gather of padded parts."""
    import torch
    import torch.distributed as dist

    def gather(input_, group, output_split_sizes=None, use_global_buffer=False):
        sizes = _uneven(output_split_sizes)
        if sizes is None or group.size() == 1:
            return original(input_, group, output_split_sizes, use_global_buffer)
        padded = input_.new_zeros((max(sizes), *input_.shape[1:]))  # (longest, ...)
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    return gather


def _even_reduce_scatter(original):
    """(8) `_reduce_scatter_along_first_dim` with uneven `input_split_sizes` as an even one over padded parts."""
    import torch
    import torch.distributed as dist

    def reduce_scatter(input_, group, input_split_sizes=None, use_global_buffer=False):
        sizes = _uneven(input_split_sizes)
        if sizes is None or group.size() == 1:
            return original(input_, group, input_split_sizes, use_global_buffer)
        parts = []
        for chunk in torch.split(input_, sizes, dim=0):  # (n_r, ...) -> (longest, ...)
            padded = chunk.new_zeros((max(sizes), *chunk.shape[1:]))
            padded[: chunk.shape[0]] = chunk
            parts.append(padded)
        output = torch.empty_like(parts[0])
        dist.reduce_scatter(output, parts, group=group)
        return output[: sizes[group.rank()]]

    return reduce_scatter


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
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1 :])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2 :])
