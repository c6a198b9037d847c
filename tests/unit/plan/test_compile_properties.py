"""Property tests of the compiler over random valid layouts: rank grid, stage map, taps, determinism."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings

from specdraft.assemble import check, compile
from specdraft.plan.memory import DTYPE_BYTES
from specdraft.spec.derived import default_aux_layers
from tests.support.layouts import valid_layouts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(valid_layouts())
def test_random_valid_layouts_compile(spec):
    errors, _ = check(spec)
    assert errors == [], [e.render() for e in errors]
    plan = compile(spec)
    par = plan.parallel
    assert plan.world_size == par.tp * par.cp * par.pp * par.dp
    coords = {(r.tp, r.cp, r.dp, r.pp) for r in plan.ranks}
    assert len(coords) == plan.world_size, "every rank has distinct decoder coordinates"
    for r in plan.ranks:
        assert r.node == r.global_rank // spec.cluster.gpus_per_node
        assert r.local_rank == r.global_rank % spec.cluster.gpus_per_node


@SETTINGS
@given(valid_layouts())
def test_stage_map_covers_every_layer_once(spec):
    plan = compile(spec)
    seen = []
    for stage in plan.stages:
        for c in stage.chunks:
            seen += range(c.first_layer, c.last_layer + 1)
            assert c.last_layer - c.first_layer + 1 == c.num_layers
    assert sorted(seen) == list(range(spec.model.num_layers))


@SETTINGS
@given(valid_layouts())
def test_tap_routes_invariants(spec):
    plan = compile(spec)
    ranks = plan.ranks
    draft_stage = plan.draft.stage
    owner = {}
    for stage in plan.stages:
        for c in stage.chunks:
            for layer in range(c.first_layer, c.last_layer + 1):
                owner[layer] = stage.pp
    aux = spec.draft.aux_layers if spec.draft.aux_layers is not None else default_aux_layers(spec.model.num_layers)
    assert list(plan.draft.aux_layers) == aux
    seen = set()
    tokens = spec.training.micro_batch_size * spec.model.seq_length // spec.parallel.cp
    if spec.parallel.sequence_parallel:
        tokens //= spec.parallel.tp
    for route in plan.tap_routes:
        src, dst = ranks[route.src_rank], ranks[route.dst_rank]
        tap = route.tap
        expected_src_stage = 0 if tap == "embedding" else spec.parallel.pp - 1 if tap == "logits" else owner[tap]
        assert src.pp == route.src_stage == expected_src_stage, "the source rank holds its tap"
        assert dst.pp == route.dst_stage == draft_stage, "the destination holds the draft"
        assert (src.tp, src.cp, src.dp) == (dst.tp, dst.cp, dst.dp)
        assert route.local == (route.src_stage == draft_stage)
        assert route.cross_node == (src.node != dst.node)
        key = (str(tap), route.src_rank, route.dst_rank)
        assert key not in seen, "no duplicate routes"
        seen.add(key)
        if tap != "logits":
            assert route.bytes_per_microbatch == tokens * spec.model.hidden_size * DTYPE_BYTES[spec.training.dtype]
    off_stage = [t for t in plan.taps if not t.local]
    non_local = [r for r in plan.tap_routes if not r.local]
    par = plan.parallel
    assert len(non_local) == len(off_stage) * par.tp * par.cp * par.dp
    assert plan.tap_traffic.bytes_per_step == sum(r.bytes_per_microbatch for r in non_local) * plan.num_microbatches
    expected_mode = "zigzag_ring_branch_merge" if spec.parallel.cp > 1 else "off"
    assert plan.draft.cp_attention == expected_mode


@settings(max_examples=25, deadline=None)
@given(valid_layouts())
def test_compile_is_deterministic(spec):
    first = compile(spec).to_json()
    second = compile(spec).to_json()
    assert first == second
    assert json.loads(first)["spec_sha256"] == compile(spec).spec_sha256
