"""The draft co-training plan on the shipped large layouts, checked explicitly (beyond the property tests)."""

from __future__ import annotations

import pytest

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.spec.load import load_layout
from tests.support.paths import SHIPPED

LAYOUTS = SHIPPED


def test_moe_141b_layout_routes_taps_across_nodes_with_vpp():
    plan = compile(load_layout(SHIPPED / "mixtral-8x22b.yaml"))
    assert plan.parallel.ep == 8 and plan.parallel.vpp == 2 and plan.world_size == 128
    assert plan.draft.stage == 3 and plan.draft.aux_layers == (1, 27, 52)
    assert plan.draft.cp_attention == "zigzag_ring_branch_merge"
    taps = {t.tap: t for t in plan.taps}
    # Layer 27 is the last layer of stage 3's first virtual chunk, 52 sits in its second: both local.
    assert (taps[27].src_stage, taps[27].src_chunk, taps[27].local) == (3, 0, True)
    assert (taps[52].src_stage, taps[52].src_chunk, taps[52].local) == (3, 1, True)
    # The embedding and layer 1 come from stage 0 (nodes 0-3) to stage 3 (nodes 12-15): every route crosses.
    for tap in ("embedding", 1):
        assert taps[tap].num_routes == taps[tap].num_cross_node == 4 * 2 * 4  # tp * cp * dp
    tokens = 16384 // 2 // 4  # micro batch tokens / cp / tp (sequence parallel)
    assert taps[1].bytes_per_microbatch == tokens * 6144 * 2
    assert taps["embedding"].bytes_per_microbatch == tokens * 6144 * 2  # each needed token once, split over tp
    assert plan.tap_traffic.bytes_per_step == plan.tap_traffic.cross_node_bytes_per_step > 0
    assert plan.memory[3].draft > 0 and all(m.draft == 0 for m in plan.memory[:3])
    assert all(m.fraction <= 1 for m in plan.memory)


def test_256k_context_layout_pads_for_zigzag_ring():
    plan = compile(load_layout(SHIPPED / "qwen3-8b-256k.yaml"))
    assert plan.parallel.cp == 16 and plan.spec.model.seq_length == 262144
    assert plan.draft.cp_attention == "zigzag_ring_branch_merge"
    pad = plan.draft.padding
    assert pad.pad_multiple == 2 * 16 * 4  # 2*cp, times tp under sequence parallelism
    assert pad.padded_lengths == (262144, 131072, 65664, 100096)
    assert pad.padding_overhead == pytest.approx((128 - 1 + 93) / sum(pad.sequence_lengths), rel=1e-3)
    # One stage: every tap is local and nothing travels.
    assert all(t.local for t in plan.taps) and plan.tap_traffic.bytes_per_step == 0
    assert dict(zip(plan.renders.megatron, plan.renders.megatron[1:]))["--context-parallel-size"] == "16"


def test_cp_without_packing_or_with_a2a_is_refused_with_a_fix():
    with pytest.raises(SpecError) as info:
        compile(load_layout(SHIPPED / "qwen3-8b-256k.yaml", ["training.packing=false", "parallel.cp_comm_type=a2a"]))
    by_path = {p.path: p for p in info.value.problems}
    assert "training.packing=true" in by_path["training.packing"].fix
    assert "p2p" in by_path["parallel.cp_comm_type"].rule and by_path["parallel.cp_comm_type"].fix


def test_draft_off_stage_gets_logits_tap_and_cp1_is_off():
    plan = compile(load_layout(None, ["draft.stage=first", "parallel.cp=1", "cluster.gpus_per_node=2"]))
    taps = {t.tap: t for t in plan.taps}
    assert taps["logits"].src_stage == 1 and not taps["logits"].local
    assert taps["embedding"].local and plan.draft.cp_attention == "off"
    assert plan.draft.landing_slots == plan.num_microbatches  # runs after the schedule: holds every microbatch
