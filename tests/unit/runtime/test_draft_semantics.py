"""The EAGLE-3 draft keeps the target's RoPE and norm epsilon (its shape and the config.json export write them)."""

from __future__ import annotations

import torch

from specdraft.assemble import compile
from specdraft.runtime.models.draft import draft_shape
from specdraft.runtime.serve.eagle3 import config
from specdraft.spec.load import load_layout
from tests.support.paths import SHIPPED


def test_a_llama31_draft_exports_the_targets_rope_and_epsilon():
    plan = compile(load_layout(SHIPPED / "llama3-70b.yaml"))
    shape = draft_shape(plan)
    assert (shape.rope_base, shape.norm_eps, shape.rope_scaling) == (500000.0, 1e-5, plan.model.rope_scaling)
    written = config(plan, torch.bfloat16)
    assert written["rope_theta"] == 500000.0 and written["rms_norm_eps"] == 1e-5
    assert written["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def test_a_qwen3_draft_has_no_rope_scaling():
    written = config(compile(load_layout(SHIPPED / "qwen3-8b.yaml")), torch.bfloat16)
    assert written["rope_theta"] == 1000000.0 and written["rms_norm_eps"] == 1e-6 and "rope_scaling" not in written
