"""BranchCoreAttention inside a tiny megatron GPTModel (local spec, fp32, CPU, gloo): cp=2 logits and parameter
grads equal a cp=1 model running megatron's own DotProductAttention, in sbhd and packed THD."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist

from specdraft.runtime import branch_attention as ba
from tests.distributed import run_distributed

# find_spec, not importorskip: the parent never needs megatron, only the spawned ranks import it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")

VOCAB, SEQ, BATCH = 64, 16, 2
THD_LENGTHS = [8, 4, 12]  # multiples of 2*cp; one of the minimum length
GRAD_PARAM = "decoder.layers.0.self_attention.linear_qkv.weight"


def _model(cp: int, ours: bool):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from specdraft.runtime.core_attention import BranchCoreAttention

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(context_parallel_size=cp)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
        context_parallel_size=cp, use_cpu_initialization=True, params_dtype=torch.float32,
        attention_dropout=0.0, hidden_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec()
    if ours:
        spec.submodules.self_attention.submodules.core_attention = BranchCoreAttention
    torch.manual_seed(0)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=64,
                    position_embedding_type="rope")


def _logits_and_grad(model, tokens, weights, **kw):
    """Logits [b, s, V] and d(sum(logits * weights))/d GRAD_PARAM; weights pick a fixed random direction."""
    model.zero_grad()
    logits = model(tokens, None, None, **kw)
    (logits * weights).sum().backward()
    return logits.detach(), dict(model.named_parameters())[GRAD_PARAM].grad.clone()


def _gather(x):
    """Every rank's shard, in rank order."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


def _worker(rank, world):
    from megatron.core.packed_seq_params import PackedSeqParams

    from specdraft.runtime import cpu_compat

    cpu_compat.apply()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    weights = torch.randn(BATCH, SEQ, VOCAB, generator=gen)
    thd_tokens = torch.randint(0, VOCAB, (1, sum(THD_LENGTHS)), generator=gen)
    thd_weights = torch.randn(1, sum(THD_LENGTHS), VOCAB, generator=gen)
    cu = torch.tensor([0, *torch.tensor(THD_LENGTHS).cumsum(0).tolist()], dtype=torch.int32)

    # cp = 1 reference: megatron's DotProductAttention; THD as separate unpacked sequences.
    reference = _model(1, ours=False)
    state = reference.state_dict()
    ref_logits, ref_grad = _logits_and_grad(reference, tokens, weights)
    thd_ref, thd_ref_grad = [], 0
    for start, end in zip(cu.tolist(), cu[1:].tolist()):
        logits, grad = _logits_and_grad(reference, thd_tokens[:, start:end], thd_weights[:, start:end])
        thd_ref.append(logits)
        thd_ref_grad = thd_ref_grad + grad
    thd_ref = torch.cat(thd_ref, 1)

    # cp = 2 with BranchCoreAttention, same weights.
    model = _model(world, ours=True)
    model.load_state_dict(state, strict=True)
    cu_b = torch.tensor([0, SEQ])
    shard = [ba.zigzag_shard(x, cu_b, world, rank, dim=1) for x in (tokens, weights)]
    logits, grad = _logits_and_grad(model, *shard)
    dist.all_reduce(grad)  # each rank holds the gradient of its own tokens' share of the loss
    logits = ba.zigzag_unshard(_gather(logits), cu_b, world, dim=1)

    packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                             cu_seqlens_kv_padded=cu, max_seqlen_q=max(THD_LENGTHS),
                             max_seqlen_kv=max(THD_LENGTHS))
    shard = [ba.zigzag_shard(x, cu, world, rank, dim=1) for x in (thd_tokens, thd_weights)]
    thd_logits, thd_grad = _logits_and_grad(model, *shard, packed_seq_params=packed)
    dist.all_reduce(thd_grad)
    thd_logits = ba.zigzag_unshard(_gather(thd_logits), cu, world, dim=1)

    def err(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    return {"sbhd logits": err(logits, ref_logits), "sbhd grad": err(grad, ref_grad),
            "thd logits": err(thd_logits, thd_ref), "thd grad": err(thd_grad, thd_ref_grad)}


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_gpt_cp2_with_branch_core_attention_matches_cp1_megatron_attention():
    for rank, errs in enumerate(run_distributed(_worker, 2, timeout=100)):
        for what, e in errs.items():
            assert e < 1e-5, f"rank {rank}: {what} relative error {e:.3g}"


def test_rejects_unsupported_configuration():
    from types import SimpleNamespace

    from specdraft.runtime.core_attention import BranchCoreAttention

    cfg = SimpleNamespace(attention_dropout=0.0)
    with pytest.raises(ValueError, match="attn_mask_type causal or padding_causal"):
        BranchCoreAttention(cfg, attn_mask_type="no_mask")
    with pytest.raises(ValueError, match="attention_dropout=0.0"):
        BranchCoreAttention(SimpleNamespace(attention_dropout=0.1), attn_mask_type="causal")
    module = BranchCoreAttention(cfg, attn_mask_type="causal", pg_collection=SimpleNamespace(cp=None))
    q = torch.randn(4, 1, 2, 8)
    with pytest.raises(ValueError, match="attention_bias"):
        module(q, q, q, None, attention_bias=torch.zeros(1))
