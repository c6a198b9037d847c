"""The target's norms on the local layer spec (RMSNorm or LayerNorm, as model.normalization says), usable under
sequence parallelism (which an MoE model with tp > 1 needs): megatron's WrappedTorchNorm refuses
sequence_parallel (transformer/torch_norm.py:32) only because plain torch norms cannot mark their weight for the TP
grad all-reduce; these do."""

from __future__ import annotations

import torch


def _check(config, name: str) -> None:
    normalization = getattr(config, "normalization", "RMSNorm")
    if normalization != name:
        raise ValueError(f"specdraft's {name} was built for config.normalization {normalization!r}")


def _tag(module: torch.nn.Module, config) -> None:
    """Under sequence parallelism each TP rank normalises its own 1/tp of the tokens, so a norm's gradient is a
    partial sum per rank: the trainer all-reduces every parameter tagged `sequence_parallel` over tp, as megatron's
    finalize_model_grads does for TE/Apex norms and the MoE router."""
    for param in module.parameters():
        param.sequence_parallel = bool(config.sequence_parallel)


class RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm with megatron's norm constructor; the weight carries `sequence_parallel`."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        _check(config, "RMSNorm")
        # In the parameters' dtype (a bf16 model gets a bf16 weight, as megatron's Float16Module would cast it):
        # an fp32 weight beside bf16 inputs sends torch's rms_norm to its slow unfused path.
        super().__init__(hidden_size, eps=eps, dtype=getattr(config, "params_dtype", None))
        _tag(self, config)


class LayerNorm(torch.nn.LayerNorm):
    """torch's LayerNorm (weight and bias) with megatron's norm constructor; both carry `sequence_parallel`."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        _check(config, "LayerNorm")
        super().__init__(hidden_size, eps=eps, dtype=getattr(config, "params_dtype", None))
        _tag(self, config)


def norm_class(normalization: str) -> type:
    """The norm module of model.normalization (the plan's resolved value: RMSNorm or LayerNorm)."""
    classes = {"RMSNorm": RMSNorm, "LayerNorm": LayerNorm}
    if normalization not in classes:
        raise ValueError(f"model.normalization {normalization!r} is not one of {', '.join(classes)}")
    return classes[normalization]
