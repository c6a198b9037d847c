"""The target (policy) model: megatron-core GPTModel chunks built from plan.json, with layout-independent init.

Core attention is specdraft's packed zigzag ring attention (S = 1), so packed THD batches run at any cp without
TransformerEngine. Parameters are initialised from their *global* name and full (unsharded) shape, so every
TP/CP/PP layout starts from the same weights as the single-process run.
"""

from __future__ import annotations

import os
import zlib

import torch
import torch.nn.functional as F

from specdraft.plan.model import LaunchPlan, ModelShape
from specdraft.runtime.models.hf.mapping import global_name, padded_vocab

INIT_STD = 0.02
# tests: megatron's batched pipeline P2P (the CUDA path) on gloo too; refused with vpp, where gloo can reorder it.
BATCH_P2P_ENV = "SPECDRAFT_BATCH_P2P"
# vocab-parallel weights (the target's embedding and output layer, the draft's LM head): padded to a tp multiple
VOCAB_PARAMETERS = ("embedding.word_embeddings.weight", "output_layer.weight", "lm_head.weight")


def _recompute_kwargs(recompute: str) -> dict:
    """training.recompute as Megatron-LM's flags set it (render/megatron.py): selective recomputes core attention,
    full recomputes every layer (uniform, one layer per checkpoint)."""
    if recompute == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if recompute == "selective":
        return {"recompute_granularity": "selective"}
    return {}


def transformer_config(plan: LaunchPlan, dtype: torch.dtype, device=None):
    """megatron's TransformerConfig for ``plan`` with parameters in ``dtype`` on ``device`` (default: CUDA when
    torch sees it): CUDA-only settings (GPU weight init, batched pipeline P2P) follow the device, not the machine."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from specdraft.runtime.models import moe

    m, par = plan.model, plan.parallel
    cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if plan.training.dtype == "fp8":
        raise ValueError(
            "training.dtype=fp8 needs TransformerEngine's FP8 GEMMs, but specdraft's runtime builds "
            "megatron's local (non-TE) layers; an fp8 layout plans and renders for Megatron-LM "
            "(`specdraft render --to megatron`), and runs here with training.dtype=bf16"
        )
    # On gloo, batched P2P can match two irecvs from one peer (pp=2 interleaved: prev == next) out of order, which
    # silently swapped later microbatches' activations; individual isend/irecv keep posting order. NCCL batches.
    batch_p2p = cuda or os.environ.get(BATCH_P2P_ENV) == "1"
    if batch_p2p and not cuda and par.vpp:
        raise ValueError(
            f"{BATCH_P2P_ENV}=1 with parallel.vpp={par.vpp} on gloo: gloo can match batched receives "
            f"from one peer out of order under the interleaved schedule; unset {BATCH_P2P_ENV}"
        )
    # perform_initialization stays on: megatron tags TP-sharded parameters (partition_dim) only while it
    # initialises them, and init_parameters needs those tags; its values are then overwritten.
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.head_dim,
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp,
        virtual_pipeline_model_parallel_size=par.vpp,
        sequence_parallel=par.sequence_parallel,
        num_layers_in_first_pipeline_stage=par.first_stage_layers,
        num_layers_in_last_pipeline_stage=par.last_stage_layers,
        account_for_embedding_in_pipeline_split=par.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=par.account_for_loss_in_pipeline_split,
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not cuda,
        perform_initialization=True,
        gated_linear_unit=m.swiglu,
        activation_func=F.silu if m.swiglu else F.gelu,
        normalization=m.normalization,
        layernorm_epsilon=m.norm_epsilon,
        add_bias_linear=m.add_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        qk_layernorm=m.qk_layernorm,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        cp_comm_type=par.cp_comm_type if par.cp > 1 else None,
        batch_p2p_comm=batch_p2p,
        **_recompute_kwargs(plan.training.recompute),
        **moe.config_kwargs(plan),
    )


def block_spec(device, dtype: torch.dtype, model: ModelShape, num_layers: int):
    """One chunk's block: ``num_layers`` layers of the chosen core attention's layer spec
    (core_attention.select_core_attention) and, on the local spec, its final norm (GPTModel would otherwise build
    megatron's default norm, which refuses sequence parallelism on CPU). TE's spec brings its own norms."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from specdraft.runtime.models.core_attention import select_core_attention
    from specdraft.runtime.models.norms import norm_class

    choice = select_core_attention(device, dtype, model.head_dim)
    layer = choice.layer_spec(model.num_experts, model.normalization, model.qk_layernorm)
    if choice.name == "te":
        return layer
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=norm_class(model.normalization))


def build_chunks(
    plan: LaunchPlan, pp_rank: int, device: torch.device, dtype: torch.dtype, seed: int, config=None, checkpoint=None
) -> list:
    """This pipeline rank's GPTModel chunks (one per virtual stage), initialised deterministically, or from the HF
    ``checkpoint`` (hf.checkpoint.HFCheckpoint) when given. ``config`` (default: transformer_config for ``device``)
    lets a CPU test build through megatron's GPU init path.

    The vocabulary is padded to a multiple of tp (hf.mapping.padded_vocab); the padded rows are zero and their
    logits are masked out of every loss and argmax (vocab.parallel.mask_padding).
    """
    import dataclasses

    from megatron.core.models.gpt import GPTModel

    par, m = plan.parallel, plan.model
    config = config or transformer_config(plan, dtype, device)
    if checkpoint is not None and config.use_cpu_initialization:
        # The CPU init path draws every weight whole before slicing it; the checkpoint overwrites it anyway, so
        # each rank only initialises its own shards (megatron's device path; cpu_compat redirects it on CPU).
        config = dataclasses.replace(config, use_cpu_initialization=False)
    chunks = []
    for v, chunk in enumerate(plan.stages[pp_rank].chunks):
        first = pp_rank == 0 and v == 0
        last = pp_rank == par.pp - 1 and v == par.num_chunks - 1
        model = GPTModel(
            config=config,
            transformer_layer_spec=block_spec(device, dtype, m, chunk.num_layers),
            vocab_size=padded_vocab(m.vocab_size, par.tp),
            max_sequence_length=m.seq_length,
            pre_process=first,
            post_process=last,
            share_embeddings_and_output_weights=m.tie_embeddings,
            position_embedding_type="rope",
            rotary_base=m.rotary_base,
            # megatron-core's Llama-3.1 scaling takes only the factor; validate refuses other low/high/original.
            rope_scaling=m.rope_scaling is not None,
            rope_scaling_factor=m.rope_scaling.factor if m.rope_scaling is not None else 8.0,
            vp_stage=v if par.vpp else None,
        )
        model.to(device)
        if checkpoint is None:
            init_parameters(model, chunk.first_layer, par.tp, seed, tied=m.tie_embeddings, vocab=m.vocab_size)
        chunks.append(model)
    if checkpoint is not None:
        from specdraft.runtime.models.hf.load import load_chunks

        load_chunks(chunks, plan, pp_rank, checkpoint)
    return chunks


@torch.no_grad()
def init_parameters(
    model: torch.nn.Module, offset: int, tp: int, seed: int, tied: bool = False, vocab: int | None = None
) -> None:
    """N(0, 0.02) weights from a generator seeded by the parameter's global name; norm weights 1, biases 0.

    The full tensor is drawn and this TP rank's slice taken, so the values do not depend on tp, pp or vpp.
    SwiGLU's fused fc1 is [gate; up] per TP shard, so its full tensor is split as two halves. An MoE expert's
    parameter is named by its global expert index and split over etp instead (moe.expert_parameter). With
    ``tied`` embeddings the last stage's copy of the output layer (pp > 1) is drawn as the word embedding, so both
    copies start equal (megatron's start-up all-reduce of the copy is overwritten here, and skipped on CPU).
    Rows of a vocab-parallel weight past ``vocab`` (the padding to a tp multiple) are zero, and the real rows are
    drawn as from an unpadded tensor, so they too are the same at every tp.
    """
    from megatron.core import parallel_state as ps

    from specdraft.runtime.models import moe

    tp_rank = ps.get_tensor_model_parallel_rank() if tp > 1 else 0
    local_experts = moe.num_local_experts(model) if hasattr(model, "config") else 0
    for name, param in model.named_parameters():
        gname = global_name(name, offset)
        if tied and gname == "output_layer.weight":
            gname = "embedding.word_embeddings.weight"
        if gname.endswith("bias"):
            param.zero_()  # linear and LayerNorm biases, as megatron initialises them
            continue
        if "norm" in gname:
            param.fill_(1.0)
            continue
        shards, rank = tp, tp_rank
        if moe.is_expert(gname):
            gname, shards, rank = moe.expert_parameter(gname, local_experts)
        sharded = getattr(param, "tensor_model_parallel", False)
        dim = getattr(param, "partition_dim", 0) if sharded else 0
        shape = list(param.shape)
        if sharded:
            shape[dim] *= shards
        pad = shape[0] - vocab if vocab is not None and gname in VOCAB_PARAMETERS and shape[0] > vocab else 0
        shape[0] -= pad
        g = torch.Generator().manual_seed(seed ^ zlib.crc32(gname.encode()))
        full = torch.randn(shape, generator=g) * INIT_STD
        if pad:
            full = torch.cat([full, full.new_zeros(pad, *shape[1:])])
        if sharded and shards > 1:
            if gname.endswith("linear_fc1.weight") and param.shape[0] * shards == shape[0] and _gated(model):
                gate, up = full.chunk(2, dim=0)
                full = torch.cat([gate.chunk(shards, dim=0)[rank], up.chunk(shards, dim=0)[rank]], dim=0)
            else:
                full = full.chunk(shards, dim=dim)[rank]
        param.copy_(full.to(param.dtype))


def _gated(model) -> bool:
    return bool(getattr(model.config, "gated_linear_unit", False))
