"""The compiler's rank grid and stage map equal megatron-core's own (RankGenerator, layer offsets)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from specdraft.assemble import compile
from specdraft.plan.compile import parallel_dims
from specdraft.plan.stages import chunk_layout
from tests.support.layouts import valid_layouts

ps = pytest.importorskip("megatron.core.parallel_state")


def _groups_from_plan(plan, dims):
    groups = {}
    for r in plan.ranks:
        key = tuple(getattr(r, k) for k in ("tp", "cp", "dp", "pp", "etp", "ep", "edp") if k not in dims)
        groups.setdefault(key, []).append(r.global_rank)
    return sorted(groups.values())


# Which plan coordinates vary inside one megatron group, per generator token.
DECODER = {
    "tp": ("tp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "pp": ("pp",),
    "tp-cp": ("tp", "cp"),
    "dp-cp": ("dp", "cp"),
    "tp-pp": ("tp", "pp"),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_layouts(max_world=256))
def test_rank_grid_equals_megatron_rank_generator(spec):
    plan = compile(spec)
    par = plan.parallel
    gen = ps.RankGenerator(tp=par.tp, ep=1, dp=par.dp, pp=par.pp, cp=par.cp, order=par.order)
    for token, dims in DECODER.items():
        # Grouping by "every other coordinate" must give exactly megatron's groups for that token.
        decoder_dims = set(dims) | {"etp", "ep", "edp"}
        ours = sorted(sorted(g) for g in _groups_from_plan(plan, decoder_dims))
        assert ours == sorted(sorted(g) for g in gen.get_ranks(token)), token
    expert = ps.RankGenerator(tp=par.etp, ep=par.ep, dp=par.edp, pp=par.pp, cp=1, order=par.order)
    for token, dims in {"tp": ("etp",), "ep": ("ep",), "dp": ("edp",), "tp-ep": ("etp", "ep")}.items():
        ours = sorted(sorted(g) for g in _groups_from_plan(plan, set(dims) | {"tp", "cp", "dp"}))
        assert ours == sorted(sorted(g) for g in expert.get_ranks(token)), f"expert {token}"
    # pp groups are shared by the decoder and the expert generators (megatron asserts it too).
    assert sorted(map(sorted, gen.get_ranks("pp"))) == sorted(map(sorted, expert.get_ranks("pp")))


def _megatron_config(spec):
    from megatron.core.transformer.transformer_config import TransformerConfig

    p = spec.parallel
    return TransformerConfig(
        num_layers=spec.model.num_layers,
        hidden_size=spec.model.hidden_size,
        num_attention_heads=spec.model.num_attention_heads,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp and p.vpp > 1 else None,
        num_layers_in_first_pipeline_stage=p.first_stage_layers,
        num_layers_in_last_pipeline_stage=p.last_stage_layers,
        account_for_embedding_in_pipeline_split=p.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=p.account_for_loss_in_pipeline_split,
        pipeline_dtype=None if p.pp == 1 else __import__("torch").float32,
        use_cpu_initialization=True,
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_layouts(max_world=64))
def test_stage_map_equals_megatron_layer_offsets(spec):
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, num_experts=None, moe_ffn_hidden_size=None))
    config = _megatron_config(spec)
    for rank, chunks in enumerate(chunk_layout(spec.model.num_layers, parallel_dims(spec))):
        for v, (first, count) in enumerate(chunks):
            vp_stage = v if config.virtual_pipeline_model_parallel_size else None
            assert get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=rank) == first, (rank, v)
            assert get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=rank) == count, (rank, v)
