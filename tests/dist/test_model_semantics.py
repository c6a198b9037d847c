"""The runtime builds what the model fields say (2 gloo ranks): LayerNorm or RMSNorm with the layout's epsilon,
biases, per-head QK norms, RoPE base and Llama-3.1 scaling (its frequencies against transformers' own llama3 RoPE
init), for the target and the draft; every rank holds exactly the parameters the plan's memory counts; and at tp2
(with and without sequence parallelism) one packed row's logits and reduced grad norm equal the dp2 rank's, which
a QK norm whose grad is not summed over tp (each TP rank normalises only its heads) breaks."""

from __future__ import annotations

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.paths import SHIPPED

pytestmark = pytest.mark.dist
LAYOUT = SHIPPED / "tiny-cpu.yaml"
BASE = ["cluster.gpus_per_node=2", "parallel.cp=1", "parallel.pp=1", "draft.enabled=true"]
SEMANTICS = [
    "model.normalization=LayerNorm",
    "model.norm_epsilon=1e-6",
    "model.add_bias_linear=true",
    "model.qk_layernorm=true",
    "model.rotary_base=500000",
    "model.rope_scaling={factor: 8.0}",
]
CASES = {
    "default-dp2": [],
    "dp2": SEMANTICS,
    "tp2": [*SEMANTICS, "parallel.tp=2"],
    "tp2-sp": [*SEMANTICS, "parallel.tp=2", "parallel.sequence_parallel=true"],
}


def _plan(overrides):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(LAYOUT, [*BASE, *overrides]))


def _structure(plan, model) -> dict:
    """What was built, in plain values."""
    from specdraft.runtime.models.draft import draft_shape, inverse_frequencies

    layer = model.decoder.layers[0]
    attention = layer.self_attention
    shape = draft_shape(plan)
    return {
        "norm_type": type(layer.input_layernorm).__name__,
        "eps": [layer.input_layernorm.eps, layer.pre_mlp_layernorm.eps, model.decoder.final_layernorm.eps],
        "qk_norm": [type(attention.q_layernorm).__name__, getattr(attention.q_layernorm, "eps", None)],
        "biases": sorted(n for n, _ in layer.named_parameters() if n.endswith("bias")),
        "inv_freq": model.rotary_pos_emb.inv_freq.double().clone(),
        "draft_inv_freq": inverse_frequencies(shape.head_dim, shape.rope_base, shape.rope_scaling).double(),
        "draft_eps": shape.norm_eps,
        "num_params": sum(p.numel() for p in model.parameters()),
        "dropout": [model.config.hidden_dropout, model.config.attention_dropout],
    }


def _forward_backward(plan, model, params) -> tuple[torch.Tensor, float, torch.Tensor]:
    """One packed row (the same on every rank): (t, V) logits gathered over vocab shards, the grad norm of
    sum(logits * fixed weights) after reduce_target_grads, and the first layer's q_layernorm grad."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime.train.batches import make_microbatch
    from specdraft.runtime.train.data import MarkovData
    from specdraft.runtime.train.grads import reduce_target_grads, target_grad_norm

    m, par = plan.model, plan.parallel
    data = MarkovData(
        vocab_size=m.vocab_size, row_tokens=m.seq_length, pad_multiple=par.pad_multiple, seed=plan.spec.training.seed
    )
    mb = make_microbatch(0, data.row(0, 0), cp=1, cp_rank=0, steps=1, device="cpu")
    out = model(
        input_ids=mb.tokens[None],
        position_ids=mb.positions[None],
        attention_mask=None,
        packed_seq_params=mb.packed_seq_params(),
    )[0]  # (t, V/tp)
    weights = torch.randn(out.shape[0], m.vocab_size, generator=torch.Generator().manual_seed(7))
    mine = weights.chunk(par.tp, dim=-1)[ps.get_tensor_model_parallel_rank()]  # (t, V/tp)
    (out * mine).sum().div(par.dp).backward()  # dp ranks repeat the row: their summed grads are one row's
    reduce_target_grads(params, par.sequence_parallel)
    norm = target_grad_norm(params, torch.device("cpu"))
    parts = [torch.empty_like(out) for _ in range(par.tp)]
    dist.all_gather(parts, out.detach().contiguous(), group=ps.get_tensor_model_parallel_group())
    q_norm = model.decoder.layers[0].self_attention.q_layernorm
    q_grad = q_norm.weight.grad.clone() if hasattr(q_norm, "weight") else None
    return torch.cat(parts, dim=-1), norm, q_grad


def _case(rank: int, plan) -> dict:
    from megatron.core import parallel_state as ps

    from specdraft.runtime.models.target import build_chunks
    from specdraft.runtime.train.grads import TargetParams

    par = plan.parallel
    ps.initialize_model_parallel(tensor_model_parallel_size=par.tp, create_gloo_process_groups=False)
    try:
        torch.manual_seed(0)
        [model] = build_chunks(plan, 0, torch.device("cpu"), torch.float32, plan.spec.training.seed)
        out = _structure(plan, model)
        out["logits"], out["grad_norm"], out["q_grad"] = _forward_backward(plan, model, TargetParams.of([model]))
        out["weights_bytes"] = plan.memory[0].weights
        return out
    finally:
        ps.destroy_model_parallel()


def _worker(rank, world_size, cases):
    from specdraft.runtime import cpu_compat

    cpu_compat.apply()
    return {name: _case(rank, _plan(overrides)) for name, overrides in cases.items()}


def _llama3_inv_freq(head_dim: int) -> torch.Tensor:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=64 // head_dim,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    return inv.double()


@pytest.mark.timeout(300)
def test_the_runtime_builds_what_the_model_fields_say():
    results = run_distributed(_worker, 2, CASES, timeout=240)
    default, built = results[0]["default-dp2"], results[0]["dp2"]
    assert default["norm_type"] == "RMSNorm" and default["eps"] == [1e-5] * 3 and default["biases"] == []
    assert default["qk_norm"] == ["IdentityOp", None] and default["draft_eps"] == 1e-5
    assert built["norm_type"] == "LayerNorm" and built["eps"] == [1e-6] * 3 and built["draft_eps"] == 1e-6
    assert built["qk_norm"] == ["LayerNorm", 1e-6]
    assert built["biases"] == [
        "input_layernorm.bias",
        "mlp.linear_fc1.bias",
        "mlp.linear_fc2.bias",
        "pre_mlp_layernorm.bias",
        "self_attention.k_layernorm.bias",
        "self_attention.linear_proj.bias",
        "self_attention.linear_qkv.bias",
        "self_attention.q_layernorm.bias",
    ]
    assert built["dropout"] == [0.0, 0.0]
    want = _llama3_inv_freq(head_dim=16)
    assert torch.allclose(built["inv_freq"], want, rtol=1e-6), (built["inv_freq"], want)
    assert torch.allclose(built["draft_inv_freq"], want, rtol=1e-6)
    for name in CASES:
        for rank in (0, 1):
            got = results[rank][name]
            assert got["num_params"] * 4 == got["weights_bytes"], (name, rank)  # fp32: the plan's count, exactly
    for name in ("tp2", "tp2-sp"):
        for rank in (0, 1):
            got = results[rank][name]
            assert torch.allclose(got["logits"], built["logits"], atol=1e-5), name
            assert got["grad_norm"] == pytest.approx(built["grad_norm"], rel=1e-5), name
            assert torch.allclose(got["q_grad"], built["q_grad"], atol=1e-6), (name, rank)
