"""Megatron core-attention adapter: causal self-attention through branch_attention (one TTT step), so the local
layer spec runs at any context parallel size without TransformerEngine, in sbhd and in packed THD, on the fused
kernel where one is usable. Also owns the choice of the target's core attention (TE's layer spec or this one)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from specdraft.runtime.attention import backend as attention_backend
from specdraft.runtime.attention.branch import branch_attention

ENV = "SPECDRAFT_CORE_ATTENTION"  # auto | te | specdraft


@dataclass(frozen=True)
class CoreAttentionChoice:
    """The target's core attention: `name` is 'te' or a branch-attention backend name (attention_backend.BACKENDS);
    `detail` says why (the backends passed over, or that TransformerEngine was found)."""

    name: str
    detail: str

    def layer_spec(self, num_experts: int | None = None, normalization: str = "RMSNorm", qk_layernorm: bool = False):
        """The megatron GPT layer spec that realises this choice, with megatron's MoE layer (router, token
        dispatcher, SequentialMLP experts) as the MLP when ``num_experts`` is set, ``normalization``'s norms
        (TE's spec reads it from the TransformerConfig) and per-head query/key norms with ``qk_layernorm``."""
        from megatron.core.models.gpt import gpt_layer_specs

        if self.name == "te":
            return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
                num_experts=num_experts, qk_layernorm=qk_layernorm
            )
        from specdraft.runtime.models.norms import norm_class

        if num_experts:
            from specdraft.runtime.models import moe

            moe.without_transformer_engine()
        spec = gpt_layer_specs.get_gpt_layer_local_spec(
            num_experts=num_experts, normalization=normalization, qk_layernorm=qk_layernorm
        )
        attention = spec.submodules.self_attention.submodules
        attention.core_attention = BranchCoreAttention
        # Norms that also run under sequence parallelism (megatron's torch norm refuses it).
        norm = norm_class(normalization)
        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = norm
        if qk_layernorm:
            attention.q_layernorm = attention.k_layernorm = norm
        return spec


def select_core_attention(device, dtype: torch.dtype, head_dim: int, choice: str | None = None) -> CoreAttentionChoice:
    """TransformerEngine's layer spec where TE is importable on CUDA ('auto'), else specdraft's local spec with
    BranchCoreAttention on the backend attention_backend picks. `choice` (else $SPECDRAFT_CORE_ATTENTION):
    auto | te | specdraft; asking for te where it cannot run raises ValueError."""
    device = torch.device(device)
    want = choice or os.environ.get(ENV) or "auto"
    if want not in ("auto", "te", "specdraft"):
        raise ValueError(f"core attention {want!r} is unknown; use auto, te or specdraft (${ENV})")
    te_here = device.type == "cuda" and importlib.util.find_spec("transformer_engine") is not None
    if want == "te" and not te_here:
        raise ValueError(
            f"core attention te needs TransformerEngine on a CUDA device; here device={device}, "
            f"transformer_engine {'found' if importlib.util.find_spec('transformer_engine') else 'absent'}"
            f" (set ${ENV}=auto or specdraft)"
        )
    if te_here and want != "specdraft":
        return CoreAttentionChoice("te", "TransformerEngine's layer spec (TEDotProductAttention)")
    detail = attention_backend.describe(device, dtype, head_dim)
    return CoreAttentionChoice(detail.split(" ", 1)[0], detail)


def attention_summary(device, dtype: torch.dtype, head_dim: int, draft: bool) -> str:
    """One line for the run's metrics: the target's core attention and (with a draft) the draft's backend."""
    target = select_core_attention(device, dtype, head_dim).name
    if not draft:
        return f"target={target}"
    return f"target={target} draft={attention_backend.describe(device, dtype, head_dim).split(' ', 1)[0]}"


def _mask_type_name(mask_type) -> str:
    return getattr(mask_type, "name", str(mask_type))


class BranchCoreAttention(torch.nn.Module):
    """Drop-in for `spec.submodules.self_attention.submodules.core_attention` on `get_gpt_layer_local_spec()`.

    Inputs arrive zigzag-sharded over the CP group (megatron's RoPE and get_batch_on_this_cp_rank already use the
    zigzag order): sbhd q/k/v `[s_local, b, heads, head_dim]`, each batch row one sequence of s_local*cp tokens,
    returning `[s_local, b, heads*head_dim]`; THD q/k/v `[t_local, heads, head_dim]` with global cu_seqlens in
    packed_seq_params (the padded ones when given), returning `[t_local, heads*head_dim]`. GQA k/v (fewer heads)
    are used as they come. Like TransformerEngine with a causal mask type, an explicit attention_mask is ignored.
    """

    _CAUSAL = ("causal", "padding_causal")

    def __init__(
        self,
        config,
        layer_number=1,
        attn_mask_type=None,
        attention_type="self",
        cp_comm_type=None,
        softmax_scale=None,
        pg_collection=None,
        **kwargs,
    ):
        super().__init__()
        if _mask_type_name(attn_mask_type) not in self._CAUSAL:
            raise ValueError(
                f"BranchCoreAttention supports attn_mask_type causal or padding_causal; got "
                f"{attn_mask_type!r} (use megatron's DotProductAttention for other masks)"
            )
        if str(getattr(attention_type, "value", attention_type)) != "self":
            raise ValueError(f"BranchCoreAttention supports attention_type 'self' only; got {attention_type!r}")
        dropout = getattr(config, "attention_dropout", 0.0)
        if dropout:
            raise ValueError(
                f"config.attention_dropout={dropout} is not supported by BranchCoreAttention; set attention_dropout=0.0"
            )
        window = getattr(config, "window_size", None)
        if window is not None:
            raise ValueError(
                f"config.window_size={window} (sliding window) is not supported by BranchCoreAttention; "
                f"set window_size=None"
            )
        self.config, self.layer_number, self.attn_mask_type = config, layer_number, attn_mask_type
        # query-key layer scaling cancels out in megatron's softmax (scale / layer_number, then * layer_number),
        # so the effective scale is the plain one
        self.softmax_scale = softmax_scale
        self._pg_collection = pg_collection

    def _cp_group(self):
        cp = getattr(self._pg_collection, "cp", None)
        if cp is None:  # no pg_collection (or one without a CP group): megatron's global CP group, if any
            from megatron.core import parallel_state

            cp = parallel_state.get_context_parallel_group(check_initialized=False)
        return cp

    def forward(
        self,
        query,
        key,
        value,
        attention_mask=None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
        **kwargs,
    ):
        if attn_mask_type is not None and _mask_type_name(attn_mask_type) not in self._CAUSAL:
            raise ValueError(f"BranchCoreAttention supports causal masks only; got attn_mask_type={attn_mask_type!r}")
        if attention_bias is not None:
            raise ValueError("BranchCoreAttention does not support attention_bias; pass attention_bias=None")
        group = self._cp_group()
        if packed_seq_params is not None and getattr(packed_seq_params, "qkv_format", None) == "thd":
            return self._thd(query, key, value, packed_seq_params, group)
        if query.dim() != 4:
            raise ValueError(f"sbhd query must be [s_local, b, heads, head_dim]; got shape {tuple(query.shape)}")
        s, b, h, d = query.shape
        cp = 1 if group is None else torch.distributed.get_world_size(group)
        # Each batch row is one sequence of s*cp tokens; its local rows already hold chunks r and 2cp-1-r, so the
        # rows of all samples back to back are exactly the zigzag shard of a packed batch.
        cu = torch.arange(b + 1, dtype=torch.int64, device=query.device) * (s * cp)
        q, k, v = (x.transpose(0, 1).reshape(1, b * s, x.shape[2], x.shape[3]) for x in (query, key, value))
        out = branch_attention(q, k, v, cu, group, self.softmax_scale)  # (1, b*s, h, d)
        return out.view(b, s, h * d).transpose(0, 1).contiguous()

    def _thd(self, query, key, value, params, group):
        if query.dim() != 3:
            raise ValueError(f"THD query must be [t_local, heads, head_dim]; got shape {tuple(query.shape)}")
        cu_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        cu_kv = params.cu_seqlens_kv_padded if params.cu_seqlens_kv_padded is not None else params.cu_seqlens_kv
        if cu_q is None:
            raise ValueError("packed_seq_params needs cu_seqlens_q (or cu_seqlens_q_padded) for THD attention")
        if cu_kv is not None and cu_kv is not cu_q and not torch.equal(cu_kv, cu_q):
            raise ValueError(
                f"self-attention needs the same q and kv sequence boundaries; got cu_seqlens_q "
                f"{cu_q.tolist()} and cu_seqlens_kv {cu_kv.tolist()}"
            )
        out = branch_attention(query[None], key[None], value[None], cu_q, group, self.softmax_scale)[0]
        return out.reshape(out.shape[0], -1)
