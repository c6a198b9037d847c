"""BranchCoreAttention inside a tiny megatron GPTModel (local spec, fp32, CPU, gloo): at cp=1 and cp=2, on the
fused kernel and on the reference path, logits and parameter grads equal a cp=1 model running megatron's own
DotProductAttention, in sbhd and packed THD; and the choice of the target's core attention."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.distributed as dist

from specdraft.runtime.attention import branch as ba
from tests.support.distributed import run_distributed

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

    from specdraft.runtime.models.core_attention import BranchCoreAttention

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(context_parallel_size=cp)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=2,
        ffn_hidden_size=64,
        context_parallel_size=cp,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_layer_local_spec()
    if ours:
        spec.submodules.self_attention.submodules.core_attention = BranchCoreAttention
    torch.manual_seed(0)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=64,
        position_embedding_type="rope",
    )


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
    from specdraft.runtime import cpu_compat
    from specdraft.runtime.attention import backend as attention_backend
    from specdraft.runtime.models.core_attention import BranchCoreAttention, select_core_attention

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

    spec = select_core_attention("cpu", torch.float32, 8).layer_spec()  # what target.py builds on CPU
    assert spec.submodules.self_attention.submodules.core_attention is BranchCoreAttention
    data, refs = (tokens, weights, thd_tokens, thd_weights, cu), (ref_logits, ref_grad, thd_ref, thd_ref_grad)
    errors = {}
    for backend, cp in (("fused-cpu-flash", 1), ("fused-cpu-flash", world), ("reference", world)):
        os.environ[attention_backend.ENV] = backend
        for what, e in _ours(cp, rank, state, data, refs).items():
            errors[f"{backend} cp{cp} {what}"] = e
    return errors


def _ours(cp, rank, state, data, refs):
    """BranchCoreAttention at `cp` (cp = 1: every rank alone), same weights, against the cp = 1 references."""
    from megatron.core.packed_seq_params import PackedSeqParams

    tokens, weights, thd_tokens, thd_weights, cu = data
    ref_logits, ref_grad, thd_ref, thd_ref_grad = refs
    model = _model(cp, ours=True)
    model.load_state_dict(state, strict=True)
    cu_b = torch.tensor([0, SEQ])
    shard = [ba.zigzag_shard(x, cu_b, cp, rank % cp, dim=1) for x in (tokens, weights)]
    logits, grad = _logits_and_grad(model, *shard)
    packed = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=max(THD_LENGTHS),
        max_seqlen_kv=max(THD_LENGTHS),
    )
    thd_shard = [ba.zigzag_shard(x, cu, cp, rank % cp, dim=1) for x in (thd_tokens, thd_weights)]
    thd_logits, thd_grad = _logits_and_grad(model, *thd_shard, packed_seq_params=packed)
    if cp > 1:  # each rank holds the gradient of its own tokens' share of the loss
        dist.all_reduce(grad)
        dist.all_reduce(thd_grad)
        logits = ba.zigzag_unshard(_gather(logits), cu_b, cp, dim=1)
        thd_logits = ba.zigzag_unshard(_gather(thd_logits), cu, cp, dim=1)

    def err(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    return {
        "sbhd logits": err(logits, ref_logits),
        "sbhd grad": err(grad, ref_grad),
        "thd logits": err(thd_logits, thd_ref),
        "thd grad": err(thd_grad, thd_ref_grad),
    }


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_gpt_with_branch_core_attention_at_cp1_and_cp2_matches_megatron_attention():
    for rank, errs in enumerate(run_distributed(_worker, 2, timeout=100)):
        assert len(errs) == 12
        for what, e in errs.items():
            assert e < 1e-5, f"rank {rank}: {what} relative error {e:.3g}"


def test_rejects_unsupported_configuration():
    from types import SimpleNamespace

    from specdraft.runtime.models.core_attention import BranchCoreAttention

    cfg = SimpleNamespace(attention_dropout=0.0)
    with pytest.raises(ValueError, match="attn_mask_type causal or padding_causal"):
        BranchCoreAttention(cfg, attn_mask_type="no_mask")
    with pytest.raises(ValueError, match="attention_dropout=0.0"):
        BranchCoreAttention(SimpleNamespace(attention_dropout=0.1), attn_mask_type="causal")
    module = BranchCoreAttention(cfg, attn_mask_type="causal", pg_collection=SimpleNamespace(cp=None))
    q = torch.randn(4, 1, 2, 8)
    with pytest.raises(ValueError, match="attention_bias"):
        module(q, q, q, None, attention_bias=torch.zeros(1))


def test_core_attention_choice(monkeypatch):
    from specdraft.runtime.models.core_attention import select_core_attention

    monkeypatch.delenv("SPECDRAFT_ATTENTION_BACKEND", raising=False)
    monkeypatch.delenv("SPECDRAFT_CORE_ATTENTION", raising=False)
    assert select_core_attention("cpu", torch.float32, 16).name == "fused-cpu-flash"  # TE needs CUDA: never here
    assert select_core_attention("cpu", torch.float16, 16).name == "reference"
    with pytest.raises(ValueError, match="core attention te needs TransformerEngine on a CUDA device"):
        select_core_attention("cpu", torch.float32, 16, choice="te")
    monkeypatch.setenv("SPECDRAFT_CORE_ATTENTION", "flex")
    with pytest.raises(ValueError, match="core attention 'flex' is unknown"):
        select_core_attention("cpu", torch.float32, 16)
