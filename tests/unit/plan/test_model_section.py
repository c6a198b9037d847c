"""The plan's resolved model section: every shipped layout's model semantics equal its published config.json."""

from __future__ import annotations

import pytest

from specdraft.assemble import compile
from specdraft.plan.model import LaunchPlan
from specdraft.spec.load import load_layout
from specdraft.spec.schema import RopeScaling
from tests.support.paths import SHIPPED

LLAMA31_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
# The values of each checkpoint's config.json on the Hugging Face hub (rms_norm_eps, rope_theta, rope_scaling,
# max_position_embeddings, attention_bias/mlp_bias, tie_word_embeddings; Qwen3 has q_norm/k_norm).
LLAMA31 = dict(
    normalization="RMSNorm",
    norm_epsilon=1e-5,
    add_bias_linear=False,
    add_qkv_bias=False,
    rotary_base=500000,
    rope_scaling=LLAMA31_ROPE,
    qk_layernorm=False,
    tie_embeddings=False,
    max_position_embeddings=131072,
    head_dim=128,
)
QWEN3 = dict(
    normalization="RMSNorm",
    norm_epsilon=1e-6,
    add_bias_linear=False,
    add_qkv_bias=False,
    rotary_base=1000000,
    rope_scaling=None,
    qk_layernorm=True,
    tie_embeddings=False,
    max_position_embeddings=40960,
    head_dim=128,
)
PUBLISHED = {
    "llama3-70b": LLAMA31,  # meta-llama/Llama-3.1-70B
    "llama3.1-8b-pat": LLAMA31,  # meta-llama/Llama-3.1-8B
    "qwen3-8b": QWEN3,  # Qwen/Qwen3-8B
    "qwen3-8b-256k": QWEN3,
    "qwen3-14b-pat": QWEN3,  # Qwen/Qwen3-14B
    "mixtral-8x22b": dict(  # mistralai/Mixtral-8x22B-v0.1
        normalization="RMSNorm",
        norm_epsilon=1e-5,
        add_bias_linear=False,
        rotary_base=1000000,
        rope_scaling=None,
        qk_layernorm=False,
        tie_embeddings=False,
        max_position_embeddings=65536,
        num_experts=8,
        moe_router_topk=2,
        moe_aux_loss_coeff=0.001,
    ),
}
# The tiny and one-GPU layouts keep what the runtime built before these fields existed (megatron's defaults).
RUNTIME_DEFAULTS = dict(
    normalization="RMSNorm",
    norm_epsilon=1e-5,
    add_bias_linear=False,
    add_qkv_bias=False,
    attention_dropout=0.0,
    hidden_dropout=0.0,
    rotary_base=10000,
    rope_scaling=None,
    qk_layernorm=False,
)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_big_layouts_carry_their_published_config(name):
    model = compile(load_layout(SHIPPED / f"{name}.yaml")).model
    assert {key: getattr(model, key) for key in PUBLISHED[name]} == PUBLISHED[name]
    assert model.attention_dropout == model.hidden_dropout == 0.0


@pytest.mark.parametrize("name", ["tiny-cpu", "mixtral-tiny-cpu", "one-gpu"])
def test_small_layouts_build_what_the_runtime_built(name):
    model = compile(load_layout(SHIPPED / f"{name}.yaml")).model
    assert {key: getattr(model, key) for key in RUNTIME_DEFAULTS} == RUNTIME_DEFAULTS
    assert model.max_position_embeddings == model.seq_length


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_big_layouts_train_with_rl_values(name):
    t = load_layout(SHIPPED / f"{name}.yaml").training
    assert t.lr <= 1e-5 and t.train_iters >= 100


def test_the_model_section_round_trips_through_plan_json():
    plan = compile(load_layout(SHIPPED / "llama3-70b.yaml"))
    back = LaunchPlan.from_json(plan.to_json())
    assert back.model == plan.model and back.model.rope_scaling == LLAMA31_ROPE
