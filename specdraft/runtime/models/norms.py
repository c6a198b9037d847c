"""The target's RMSNorm on the local layer spec, usable under sequence parallelism (which an MoE model with tp > 1
needs): megatron's WrappedTorchNorm refuses sequence_parallel (transformer/torch_norm.py:32) only because plain
torch norms cannot mark their weight for the TP grad all-reduce; this one does."""

from __future__ import annotations

import torch


class RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm with megatron's norm constructor; the weight carries `sequence_parallel`.

    Under sequence parallelism each TP rank normalises its own 1/tp of the tokens, so the weight's gradient is a
    partial sum per rank: the trainer all-reduces every parameter tagged `sequence_parallel` over tp, as
    megatron's finalize_model_grads does for TE/Apex norms and the MoE router.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        if getattr(config, "normalization", "RMSNorm") != "RMSNorm":
            raise ValueError(f"specdraft's target norm is RMSNorm; config.normalization is {config.normalization!r}")
        # In the parameters' dtype (a bf16 model gets a bf16 weight, as megatron's Float16Module would cast it):
        # an fp32 weight beside bf16 inputs sends torch's rms_norm to its slow unfused path.
        super().__init__(hidden_size, eps=eps, dtype=getattr(config, "params_dtype", None))
        self.weight.sequence_parallel = bool(config.sequence_parallel)
