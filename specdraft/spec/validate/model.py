"""Rules of the model's layer semantics (norm, biases, dropout, RoPE): what Megatron-LM and specdraft's runtime can
build. Called by validate.validate_fields with its `err` and `warn` collectors."""

from __future__ import annotations

import re
from dataclasses import fields

from specdraft.spec.derived import etp
from specdraft.spec.schema import LayoutSpec, ModelSpec, RopeScaling

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MODEL_FIELDS = frozenset(f.name for f in fields(ModelSpec))

# megatron-core's RotaryEmbedding._apply_scaling takes only the factor from its caller (GPTModel's
# rope_scaling_factor, Megatron-LM's --rope-scaling-factor); the other three are Llama-3.1's, fixed.
FIXED_ROPE_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def model_rules(spec: LayoutSpec, err, warn) -> None:
    m = spec.model
    if m.config_sha256 is not None and not SHA256_RE.match(m.config_sha256):
        err("model.config_sha256", m.config_sha256, "must be 64 lowercase hex digits", "leave it out")
    unknown = [f for f in m.config_fields if f not in MODEL_FIELDS]
    if unknown:
        err("model.config_fields", m.config_fields, f"names no model field: {', '.join(unknown)}", "leave it out")
    if not 0 < m.norm_epsilon < 1:
        err("model.norm_epsilon", m.norm_epsilon, "must be in (0, 1)", "take it from HF rms_norm_eps (e.g. 1e-5)")
    for fname in ("attention_dropout", "hidden_dropout"):
        value = getattr(m, fname)
        if not 0 <= value < 1:
            err(f"model.{fname}", value, "must be in [0, 1)", "use 0 for RL post-training")
    if m.attention_dropout > 0:
        err(
            "model.attention_dropout",
            m.attention_dropout,
            "specdraft's runtime cannot build it: its core attention (packed ring attention with the draft's "
            "branch merge) has no dropout on the attention probabilities",
            "use 0 (post-training runs without attention dropout)",
        )
    if m.rotary_base < 2:
        err("model.rotary_base", m.rotary_base, "must be >= 2", "take it from HF rope_theta (e.g. 500000)")
    if m.rope_scaling is not None:
        _rope_scaling_rules(m.rope_scaling, err)
    if m.max_position_embeddings is not None:
        if m.max_position_embeddings < 1:
            err("model.max_position_embeddings", m.max_position_embeddings, "must be >= 1, or null", "use null")
        elif m.seq_length > m.max_position_embeddings:
            warn(
                "model.seq_length",
                m.seq_length,
                f"is longer than the model was trained for (max_position_embeddings {m.max_position_embeddings}); "
                "RoPE extrapolates past it",
                "expect quality to drop past that length, or train at a length within it",
            )
    if m.add_bias_linear and m.num_experts is not None and etp(spec.parallel) != 1:
        # megatron-core's TransformerConfig asserts it ("Bias in Moe is only supported when ETP==1").
        err(
            "model.add_bias_linear",
            True,
            f"biases in MoE experts need expert tensor parallelism 1 (parallel.etp is {etp(spec.parallel)})",
            "set parallel.etp=1",
        )
    if m.add_bias_linear and m.add_qkv_bias:
        warn(
            "model.add_qkv_bias",
            True,
            "add_bias_linear already gives the QKV projection its bias",
            "set model.add_qkv_bias=false",
        )


def _rope_scaling_rules(r: RopeScaling, err) -> None:
    if r.factor < 1:
        err("model.rope_scaling.factor", r.factor, "must be >= 1", "Llama-3.1 uses 8")
    for name, fixed in FIXED_ROPE_SCALING.items():
        value = getattr(r, name)
        if value != fixed:
            err(
                f"model.rope_scaling.{name}",
                value,
                f"Megatron (megatron-core's RotaryEmbedding, Megatron-LM's --use-rope-scaling) builds only "
                f"Llama-3.1's {name} = {fixed}; only the factor is a setting",
                f"use {fixed}",
            )
