"""--account-for-embedding/loss-in-pipeline-split, training.dtype fp8 and grad_reduce_in_bf16: the rules, the stage
map (megatron-core's own is checked in test_megatron_parity), the memory estimate and the Megatron render."""

from __future__ import annotations

import dataclasses

import pytest

from specdraft.assemble import check, compile
from specdraft.plan.compile import parallel_dims, plan_memory
from specdraft.plan.stages import chunk_layout
from specdraft.spec.load import load_layout
from tests.support.paths import REPO

ROOT = REPO
BIG = ROOT / "layouts" / "llama3-70b.yaml"
ACCOUNT_BOTH = [
    "parallel.account_for_embedding_in_pipeline_split=true",
    "parallel.account_for_loss_in_pipeline_split=true",
]


def errors_for(overrides, layout=BIG):
    return {e.path: e for e in check(load_layout(layout, overrides))[0]}


def test_126_layers_over_pp8_vpp8_with_embedding_and_loss_counted():
    # Llama-3.1-405B's depth on the published 1,024-GPU layout: 128 slots = 8 stages x 8 chunks x 2.
    spec = load_layout(
        BIG,
        [
            "model.num_layers=126",
            "parallel.pp=8",
            "parallel.vpp=8",
            "parallel.cp=1",
            "cluster.num_nodes=16",
            "training.recompute=full",
            *ACCOUNT_BOTH,
        ],
    )
    chunks = chunk_layout(spec.model.num_layers, parallel_dims(spec))
    assert chunks[0][0] == (0, 1)  # the embedding takes the first slot
    assert chunks[-1][-1] == (125, 1)  # the loss takes the last
    assert chunks[1][0] == (1, 2) and chunks[0][1] == (15, 2)
    assert sorted(layer for stage in chunks for first, n in stage for layer in range(first, first + n)) == list(
        range(126)
    )
    plan = compile(spec)
    assert [s.num_layers for s in plan.stages] == [15, 16, 16, 16, 16, 16, 16, 15]
    argv = plan.renders.megatron
    assert "--account-for-embedding-in-pipeline-split" in argv and "--account-for-loss-in-pipeline-split" in argv


def test_accounting_moves_memory_off_the_end_stages():
    plain = load_layout(BIG, ["model.num_layers=78", "parallel.pp=4", "parallel.last_stage_layers=18"])
    counted = load_layout(BIG, ["model.num_layers=78", "parallel.pp=4", *ACCOUNT_BOTH])
    even = load_layout(BIG, ["model.num_layers=80", "parallel.pp=4"])
    first, last = plan_memory(counted)[0], plan_memory(counted)[-1]
    assert first.weights < plan_memory(even)[0].weights and last.weights < plan_memory(even)[-1].weights
    assert check(plain)[0] == [] and check(counted)[0] == []


@pytest.mark.parametrize(
    "overrides, path, needle",
    [
        (
            [*ACCOUNT_BOTH, "parallel.first_stage_layers=19"],
            "parallel.account_for_embedding_in_pipeline_split",
            "uneven split",
        ),
        (["parallel.account_for_loss_in_pipeline_split=true"], "parallel.pp", "must divide num_layers + the accounted"),
        ([*ACCOUNT_BOTH, "model.num_layers=78", "parallel.vpp=3"], "parallel.vpp", "must divide the layers per stage"),
        ([*ACCOUNT_BOTH, "model.num_layers=14", "parallel.vpp=4"], "parallel.pp", "no transformer layer"),
        (["training.dtype=fp8", "cluster.gpu=a100-80gb"], "training.dtype", "FP8 tensor cores"),
        (["training.grad_reduce_in_bf16=true", "training.dtype=fp32"], "training.grad_reduce_in_bf16", "dtype is fp32"),
    ],
)
def test_rules_name_the_field_the_rule_and_a_fix(overrides, path, needle):
    found = errors_for(overrides)
    assert path in found, sorted(found)
    assert needle in found[path].rule and found[path].fix


def test_fp8_memory_and_render():
    bf16 = load_layout(BIG)
    fp8 = load_layout(BIG, ["training.dtype=fp8", "training.grad_reduce_in_bf16=true"])
    a, b = plan_memory(bf16)[1], plan_memory(fp8)[1]
    assert b.grads == a.grads // 2  # bf16 main grads
    assert b.activations < a.activations  # TE keeps the GEMM inputs it saves in fp8
    argv = compile(fp8).renders.megatron
    i = argv.index("--fp8-format")
    assert argv[i : i + 4] == ("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise")
    assert "--bf16" in argv and "--fp8-param-gather" in argv and "--grad-reduce-in-bf16" in argv
    assert "--fp8" not in argv  # Megatron-LM has no such flag


def test_runtime_refuses_fp8_clearly():
    torch = pytest.importorskip("torch")
    from specdraft.runtime.models.target import transformer_config

    plan = compile(load_layout(None, ["training.dtype=fp8", "cluster.gpu=h100-80gb"]))
    with pytest.raises(ValueError, match="TransformerEngine"):
        transformer_config(plan, torch.float32)
    plan = compile(load_layout(None))
    assert transformer_config(dataclasses.replace(plan), torch.float32).num_layers == plan.model.num_layers
