"""The estimate's communication and memory mechanisms against their sources: pipeline sends against megatron-core's
own schedule arithmetic, TP exposure under each overlap mode, the --tp-comm-overlap render, and activation memory
against Korthikanti et al.'s Table 2 (multi-head) with K and V at the GQA width."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from specdraft.assemble import compile
from specdraft.perf.costs import Shape
from specdraft.perf.estimate import Estimator
from specdraft.perf.layout import layout_of
from specdraft.plan.compile import parallel_dims
from specdraft.plan.memory import activation_bytes_per_layer
from specdraft.spec import derived
from specdraft.spec.schema import ClusterSpec, DraftSpec, LayoutSpec, ModelSpec, ParallelSpec, TrainingSpec


def spec_of(*, tp=1, pp=1, vpp=None, sp=False, overlap=False, heads=32, groups=None, nodes=4) -> LayoutSpec:
    """A 32-layer, 4096-wide model on `nodes` x 8 H100s, no draft (the plain Megatron step)."""
    return LayoutSpec(
        name="mechanisms",
        model=ModelSpec(
            num_layers=32,
            hidden_size=4096,
            ffn_hidden_size=16384,
            num_attention_heads=heads,
            num_query_groups=groups,
            vocab_size=32000,
            seq_length=4096,
            swiglu=False,
        ),
        cluster=ClusterSpec(num_nodes=nodes, gpus_per_node=8, gpu="h100-80gb"),
        parallel=ParallelSpec(tp=tp, pp=pp, vpp=vpp, sequence_parallel=sp),
        draft=DraftSpec(enabled=False),
        training=TrainingSpec(global_batch_size=64, micro_batch_size=1, recompute="none", tp_comm_overlap=overlap),
    )


def megatron_warmup(pp: int, vpp: int, microbatches: int, rank: int = 0) -> int:
    """Warm-up forwards of pipeline rank ``rank`` from megatron-core's own schedule arithmetic."""
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
    comm = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)
    _, _, warmup, _ = get_pp_rank_microbatches(microbatches, vpp, pp, p2p_communicator=comm)
    return warmup


@pytest.mark.parametrize("pp,vpp", [(4, 2), (4, 4), (8, 2), (2, 8)])
def test_interleaved_sends_block_only_in_warmup_and_flush(pp, vpp):
    spec = spec_of(tp=2, pp=pp, vpp=vpp, sp=True)
    est = Estimator(spec)
    lay = layout_of(spec)
    unit, pipe = est._unit(lay), est.pipeline(lay)
    assert pipe.fill == pytest.approx(2 * megatron_warmup(pp, vpp, unit.microbatches) * unit.send, rel=1e-12)
    # Steady state: every send runs behind a chunk's compute, so a stage costs exactly its layers (and ends).
    for stage, t in enumerate(pipe.times):
        extra = (unit.embedding if stage == 0 else 0.0) + (unit.head if stage == pp - 1 else 0.0)
        assert t == pytest.approx(sum(lay.chunks[stage]) * unit.layer_time + extra, rel=1e-12)
    full = est.estimate(lay)
    assert full.breakdown["pp_p2p_s"] == pytest.approx(pipe.fill, rel=1e-12)


def test_non_interleaved_sends_block_every_microbatch():
    spec = spec_of(tp=2, pp=4, sp=True)
    est = Estimator(spec)
    lay = layout_of(spec)
    unit, pipe = est._unit(lay), est.pipeline(lay)
    assert pipe.fill == 0.0
    middle = pipe.times[1] - sum(lay.chunks[1]) * unit.layer_time
    assert middle == pytest.approx(2 * unit.send, rel=1e-12), "a middle stage sends forward and backward, blocking"


def test_tp_exposure_follows_each_overlap_mode():
    def tp_comm(**kw):
        spec = spec_of(tp=4, nodes=1, **kw)
        est = Estimator(spec)
        lay = layout_of(spec)
        shape = Shape.of(lay.dims, "none")
        assert shape == (4, 1, kw.get("sp", False), "none", 1, 1, 4)
        layer = est.costs.layer(shape, est.bandwidths(lay))
        return layer.tp_comm, est.costs, est.bandwidths(layout_of(spec))

    overlap, costs, bw = tp_comm(sp=True, overlap=True)
    blocking, _, _ = tp_comm(sp=True)
    no_sp, _, _ = tp_comm()
    c = costs.collective(4096 * 4096 * 2, 4, bw.tp)  # one all-gather of a block's activation
    assert overlap == pytest.approx(2 * c / 4, rel=1e-12), "one ring step of each forward reduce-scatter"
    assert blocking == pytest.approx(2 * 3 * c, rel=1e-12), "forward all-gather + reduce-scatter, grad all-gather"
    assert no_sp == pytest.approx(2 * 2 * c, rel=1e-12), "the forward all-reduce"
    # Without sequence parallelism Megatron has no TP overlap: the flag changes nothing.
    assert tp_comm(overlap=True)[0] == pytest.approx(no_sp, rel=1e-12)


def test_render_passes_tp_comm_overlap_only_where_megatron_takes_it():
    cases = {(2, True, True): True, (2, False, True): False, (1, False, True): False, (2, True, False): False}
    for (tp, sp, overlap), expected in cases.items():
        plan = compile(spec_of(tp=tp, sp=sp, overlap=overlap, nodes=1))
        assert ("--tp-comm-overlap" in plan.renders.megatron) is expected, (tp, sp, overlap)


def test_tp_comm_overlap_defaults_as_nvidias_performance_recipes():
    """Unset, it is on wherever Megatron-LM can overlap (tp > 1 under sequence parallelism, TE on a GPU), as
    Megatron-Bridge's performance recipes set it (tp_comm_overlap = tp > 1); never on a CPU cluster."""
    for tp, sp, expected in [(2, True, True), (2, False, False), (1, False, False)]:
        plan = compile(spec_of(tp=tp, sp=sp, overlap=None, nodes=1))
        assert plan.training.tp_comm_overlap is expected, (tp, sp)
        assert ("--tp-comm-overlap" in plan.renders.megatron) is expected, (tp, sp)
    base = spec_of(tp=2, sp=True, overlap=None, nodes=1)
    cpu = dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, gpu="cpu"))
    assert not derived.tp_comm_overlap(cpu, 2, True)


@pytest.mark.parametrize("tp,groups", [(1, None), (4, None), (4, 8), (8, 4)])
def test_activation_memory_is_table_2_with_k_and_v_at_the_gqa_width(tp, groups):
    """Korthikanti et al. 2022, Table 2 with flash attention (no s^2 terms): sbh (10 + 24/t) for multi-head
    attention, a GeLU MLP four times as wide and dropout on (bf16, no sequence parallelism); GQA stores K and V g/a
    as wide. Beyond the table: each norm's fp32 statistic per token and flash attention's fp32 log-sum-exp."""
    base = spec_of(tp=tp, groups=groups)
    spec = dataclasses.replace(base, model=dataclasses.replace(base.model, hidden_dropout=0.1))
    tokens, h, heads = 4096, 4096, 32
    got = activation_bytes_per_layer(spec, parallel_dims(spec), tokens)
    ratio = (groups or 32) / 32
    extras = 2 * 4 + 4 * heads / tp  # two RMSNorm rstd rows, the lse per head
    assert got == pytest.approx(tokens * (h * (10 + (24 - 4 * (1 - ratio)) / tp) + extras), rel=1e-12)
    sp = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, sequence_parallel=tp > 1))
    if tp > 1:
        assert activation_bytes_per_layer(sp, parallel_dims(sp), tokens) == pytest.approx(
            tokens * (h * (34 - 4 * (1 - ratio)) + 2 * 4 + 4 * heads) / tp, rel=1e-12
        )
    # Without dropout (Llama, Qwen) torch's dropout returns its input: the two 1-byte masks are not kept.
    assert activation_bytes_per_layer(base, parallel_dims(base), tokens) == pytest.approx(got - 2 * tokens * h)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_swiglu_keeps_its_2ffn_wide_input_and_fc2_its_ffn_wide_input(tp):
    """Megatron-LM's 18 + 4*ffn/h counts GeLU (fc1 output and fc2 input, ffn wide each). The fused SwiGLU saves
    its 2*ffn-wide input and fc2 its ffn-wide input: 6*ffn/h, +24% per layer for Llama-3.1-8B (ffn/h 3.5)."""
    llama = dataclasses.replace(spec_of(tp=tp, groups=8).model, ffn_hidden_size=14336, swiglu=True, hidden_dropout=0.1)
    spec = dataclasses.replace(spec_of(tp=tp, groups=8), model=llama)
    gelu = dataclasses.replace(spec, model=dataclasses.replace(llama, swiglu=False))
    tokens, h, ffn = 4096, 4096, 14336
    got = activation_bytes_per_layer(spec, parallel_dims(spec), tokens)
    assert got - activation_bytes_per_layer(gelu, parallel_dims(gelu), tokens) == pytest.approx(
        tokens * h * (6 - 4) * ffn / h / tp
    )
    if tp == 1:
        megatron = tokens * h * (18 + 4 * ffn / h)  # theoretical_memory_usage.py, MHA-wide K and V
        gqa = tokens * h * (4 - 4 * 8 / 32)  # K and V at 8 of 32 heads' width
        assert (got - 2 * 4 * tokens - 4 * 32 * tokens) / (megatron - gqa) == pytest.approx(1.24, abs=0.005)
