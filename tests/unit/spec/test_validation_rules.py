"""Validation rules: each names the field path, the value, the rule and a fix; all problems come at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdraft.assemble import check, compile
from specdraft.errors import SpecError
from specdraft.spec.load import load_layout
from tests.support.paths import SHIPPED

LAYOUTS = sorted((SHIPPED).glob("*.yaml"))
BIG = SHIPPED / "llama3-70b.yaml"


def errors_for(overrides, layout=None):
    errors, _ = check(load_layout(layout, overrides))
    found = {}
    for e in errors:
        found.setdefault(e.path, []).append(e)
    return found


@pytest.mark.parametrize("layout", LAYOUTS, ids=[p.stem for p in LAYOUTS])
def test_shipped_layouts_are_valid_and_fit(layout):
    errors, warnings = check(load_layout(layout))
    assert errors == []
    plan = compile(load_layout(layout))
    assert all(stage.fraction <= 1.0 for stage in plan.memory)


@pytest.mark.parametrize(
    "overrides, path, needle",
    [
        (["cluster.gpus_per_node=3"], "parallel", "must divide the world size"),
        (["parallel.dp=3"], "parallel.dp", "must equal the world size"),
        (["parallel.tp=3", "cluster.gpus_per_node=12"], "parallel.tp", "must divide model.num_attention_heads"),
        (["model.seq_length=66"], "model.seq_length", "multiple of 2*cp"),
        (["parallel.sequence_parallel=true"], "parallel.sequence_parallel", "needs tp > 1"),
        (["parallel.pp=3", "cluster.gpus_per_node=6"], "parallel.pp", "must divide model.num_layers"),
        (
            ["parallel.first_stage_layers=3", "parallel.last_stage_layers=3"],
            "parallel.first_stage_layers",
            "must equal model.num_layers",
        ),
        (["parallel.vpp=3"], "parallel.vpp", "multiple of vpp"),
        (["parallel.ep=2"], "parallel.ep", "needs an MoE model"),
        (["model.moe_aux_loss_coeff=0.01"], "model.moe_aux_loss_coeff", "needs an MoE model"),
        (["parallel.cp_comm_type=a2a+p2p"], "parallel.hierarchical_cp_sizes", "product is cp"),
        (["draft.aux_layers=[1,1,9]"], "draft.aux_layers", "out of range"),
        (["draft.ttt_steps=0"], "draft.ttt_steps", ">= 1"),
        (["draft.stage=7"], "draft.stage", "no such pipeline stage"),
        (["training.packing=false"], "training.packing", "needs packed"),
        (["parallel.cp_comm_type=a2a"], "parallel.cp_comm_type", "p2p"),
        (["model.num_layers=6"], "draft.aux_layers", "distinct"),
        (["name=bad name"], "name", "letters"),
        (["model.hidden_dropout=1.0"], "model.hidden_dropout", "[0, 1)"),
        (["model.attention_dropout=-0.1"], "model.attention_dropout", "[0, 1)"),
        (["model.attention_dropout=0.1"], "model.attention_dropout", "runtime cannot build it"),
        (["model.norm_epsilon=0"], "model.norm_epsilon", "(0, 1)"),
        (["model.rotary_base=1"], "model.rotary_base", ">= 2"),
        (["model.max_position_embeddings=0"], "model.max_position_embeddings", ">= 1"),
        (["model.rope_scaling={factor: 0.5}"], "model.rope_scaling.factor", ">= 1"),
        (
            ["model.rope_scaling={factor: 8, high_freq_factor: 2}"],
            "model.rope_scaling.high_freq_factor",
            "only the factor is a setting",
        ),
        (
            ["model.rope_scaling={original_max_position_embeddings: 4096}"],
            "model.rope_scaling.original_max_position_embeddings",
            "builds only Llama-3.1's",
        ),
        (["slurm.partition=x;rm"], "slurm.partition", "plain Slurm name"),
        (
            ["cluster.num_nodes=2", "training.global_batch_size=3"],
            "training.global_batch_size",
            "multiple of micro_batch_size",
        ),
    ],
)
def test_rule_reports_path_value_rule_and_fix(overrides, path, needle):
    found = errors_for(overrides)
    assert path in found, sorted(found)
    matching = [p for p in found[path] if needle in p.rule]
    assert matching, [p.rule for p in found[path]]
    assert all(p.fix for p in matching), "every problem carries a fix"


def test_moe_rules_name_the_field_value_rule_and_fix():
    moe = SHIPPED / "mixtral-tiny-cpu.yaml"
    found = errors_for(["parallel.sequence_parallel=false", "model.moe_aux_loss_coeff=-0.1"], layout=moe)
    [sp] = found["parallel.sequence_parallel"]
    assert "MoE model with tp > 1 (tp = 2) needs sequence parallelism" in sp.rule
    assert sp.fix == "set parallel.sequence_parallel=true"
    [coeff] = found["model.moe_aux_loss_coeff"]
    assert coeff.value == -0.1 and ">= 0" in coeff.rule and "router_aux_loss_coef" in coeff.fix


def test_moe_biases_need_etp_1():
    moe = SHIPPED / "mixtral-tiny-cpu.yaml"
    found = errors_for(["model.add_bias_linear=true", "parallel.etp=2"], layout=moe)
    [bias] = found["model.add_bias_linear"]
    assert "parallel.etp is 2" in bias.rule and bias.fix == "set parallel.etp=1"
    assert "model.add_bias_linear" not in errors_for(["model.add_bias_linear=true"], layout=moe)


def test_a_sequence_longer_than_the_trained_context_is_a_warning():
    _, warnings = check(load_layout(SHIPPED / "qwen3-8b-256k.yaml"))
    [long] = [w for w in warnings if w.path == "model.seq_length"]
    assert long.value == 262144 and "max_position_embeddings 40960" in long.rule


def test_tp_fix_lists_valid_sizes():
    found = errors_for(
        [
            "parallel.tp=6",
            "cluster.num_nodes=2",
            "cluster.gpus_per_node=8",
            "parallel.cp=1",
            "parallel.pp=1",
            "parallel.dp=-1",
            "model.num_attention_heads=64",
            "model.num_query_groups=64",
            "model.hidden_size=4096",
        ],
        layout=BIG,
    )
    assert "use one of 1, 2, 4, 8, 16, 32, 64" in found["parallel.tp"][0].fix


def test_every_problem_is_reported_at_once():
    found = errors_for(["parallel.sequence_parallel=true", "draft.ttt_steps=0", "draft.stage=9", "model.seq_length=66"])
    assert {"parallel.sequence_parallel", "draft.ttt_steps", "draft.stage", "model.seq_length"} <= set(found)


def test_a_bad_size_does_not_hide_the_rules_of_the_others():
    # cp=0 leaves no world-size arithmetic to do, but tp's own rule against the heads still holds.
    found = errors_for(["parallel.cp=0", "parallel.tp=3", "slurm.time=abc"])
    assert {"parallel.cp", "parallel.tp", "slurm.time"} <= set(found)


def test_memory_over_hbm_is_an_error_and_near_is_a_warning():
    errors, _ = check(
        load_layout(BIG, ["parallel.tp=1", "parallel.pp=1", "parallel.cp=1", "parallel.sequence_parallel=false"])
    )
    assert any(e.path.startswith("memory.stage[") and "exceeds" in e.rule for e in errors)
    errors, warnings = check(load_layout(Path(BIG).with_name("qwen3-8b.yaml"), ["model.seq_length=28672"]))
    assert not errors
    warned = [w for w in warnings if w.path == "memory.stage[1]" and "of the h100-80gb HBM" in w.rule]
    assert warned and "--balance" in warned[0].fix, "the draft's stage is the heavy one: the fix says how to even it"


def test_tp_spanning_nodes_is_a_warning_not_an_error():
    errors, warnings = check(load_layout(BIG, ["cluster.gpus_per_node=4", "cluster.num_nodes=16"]))
    assert not errors
    assert any(w.path == "parallel.tp" and "spans nodes" in w.rule for w in warnings)


def test_tp_4_without_sequence_parallelism_is_a_hint_as_in_nvidias_recipes():
    qwen = Path(BIG).with_name("qwen3-8b.yaml")  # tp 2, no sequence parallelism
    hinted = [w for w in check(load_layout(qwen, ["parallel.tp=4"]))[1] if w.path == "parallel.sequence_parallel"]
    assert len(hinted) == 1 and "off at tp = 4" in hinted[0].rule and "NVIDIA's recipes" in hinted[0].rule
    assert "parallel.sequence_parallel=true" in hinted[0].fix
    for quiet in (["parallel.tp=4", "parallel.sequence_parallel=true"], ["parallel.tp=2"]):
        assert not [w for w in check(load_layout(qwen, quiet))[1] if w.path == "parallel.sequence_parallel"], quiet


def test_compile_raises_with_every_problem():
    with pytest.raises(SpecError) as info:
        compile(load_layout(None, ["draft.ttt_steps=0", "draft.stage=9"]))
    assert len(info.value.problems) == 2
