"""The rollout cost model against its calibration anchors, and the profile table's CSV round trip and errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.errors import UserError
from specdraft.rollout import costmodel
from specdraft.rollout.costmodel import (BLOCK_OVERHEAD_S, FLOPS_EFFICIENCY, HBM_EFFICIENCY, expected_accepted,
                                         steps_time, steps_within)
from specdraft.rollout.instances import kv_budget
from specdraft.rollout.profile import CONTEXTS, ProfileCost, read_csv, table_rows, to_csv
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.load import builtin_layout_text, load_layout_text


def layout(*overrides):
    return load_layout_text(builtin_layout_text("qwen3-8b"), list(overrides), source="<built-in qwen3-8b>")


COST = costmodel.from_spec(layout())


def test_expected_accepted_tokens_closed_form():
    assert expected_accepted(0.7, 3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert expected_accepted(0.0, 5) == 1.0 and expected_accepted(0.9, 0) == 1.0
    assert expected_accepted(1.0, 4) == 5.0
    assert [expected_accepted(0.6, k) for k in range(1, 6)] == sorted(expected_accepted(0.6, k) for k in range(1, 6))


def test_gemm_model_reproduces_the_vidur_anchor():
    """Llama-2-7B MLP on H100: ~180 us at TP1 and ~45 us at TP8 for <= 64 tokens, ~375 us at TP1 for 512."""
    params = 3 * 4096 * 11008
    h100 = CATALOGUE["h100-80gb"]

    def mlp(tp, tokens):
        mem = params * 2 / tp / (HBM_EFFICIENCY * h100.hbm_bw)
        flops = 2 * params * tokens / tp / (FLOPS_EFFICIENCY * h100.peak_flops)
        return max(mem, flops) + BLOCK_OVERHEAD_S

    assert mlp(1, 64) == pytest.approx(180e-6, rel=0.05)
    assert mlp(8, 64) == pytest.approx(45e-6, rel=0.05)
    assert mlp(1, 512) == pytest.approx(375e-6, rel=0.05)


def test_allreduce_lands_in_the_measured_range():
    for tp in (2, 4, 8):
        assert 30e-6 <= COST.allreduce(tp, 2 * 2**20) <= 45e-6


def test_tp8_single_sequence_decode_is_only_a_few_times_faster_than_tp1():
    ratio = COST.decode_step(1, 1, 2048, False) / COST.decode_step(8, 1, 2048, False)
    assert 1.3 <= ratio <= 3.0, ratio


def test_speculation_gain_falls_as_the_batch_grows():
    e = COST.tokens_per_step(True)

    def gain(batch, ctx=1024):
        return (e / COST.decode_step(1, batch, batch * ctx, True)) / (1 / COST.decode_step(1, batch, batch * ctx, False))

    # Once the verify's batch x (k+1) tokens turn the GEMMs compute-bound (a few hundred tokens), the gain falls.
    gains = [gain(b) for b in (64, 96, 128, 192, 256)]
    assert gains == sorted(gains, reverse=True)
    assert gain(1) > 1.5 and gain(256) < 0.7 * gain(1)
    short = costmodel.from_spec(layout("rollout.acceptance_rate=0.3"))
    assert short.speculation_threshold(1, 256) < costmodel.MAX_NUM_SEQS  # a weak draft stops paying at big batch


def test_kv_capacity_leaves_room_for_the_draft():
    spec = layout()
    budget = kv_budget(spec)
    tokens = budget["kv_bytes_per_gpu"] / budget["kv_bytes_per_token_per_gpu"]
    assert 0 < COST.kv_capacity_tokens(1) < tokens
    assert COST.kv_capacity_tokens(8) > 8 * COST.kv_capacity_tokens(1)  # weights shard, so the room more than scales


@settings(max_examples=60, deadline=None)
@given(a=st.floats(1e-4, 0.1), b=st.floats(0, 1e-6), s0=st.floats(0, 1e6), g=st.floats(0, 1000),
       n=st.floats(0, 5000))
def test_fluid_step_time_inverts(a, b, s0, g, n):
    t = steps_time(a, b, s0, g, n)
    assert steps_within(a, b, s0, g, t) == pytest.approx(n, rel=1e-6, abs=1e-6)


def test_profile_round_trip_matches_the_model_and_interpolates(tmp_path):
    rows = table_rows(COST, [1, 2])
    path = tmp_path / "profile.csv"
    path.write_text(to_csv(rows))
    prof = ProfileCost.wrap(COST, read_csv(path))
    for r in rows[::7]:
        ctx = r["batch"] * r["context"]
        assert prof.decode_step(r["tp"], r["batch"], ctx, False) == pytest.approx(r["decode_s"], rel=1e-6)
        assert prof.decode_step(r["tp"], r["batch"], ctx, True) == pytest.approx(r["spec_decode_s"], rel=1e-6)
    lo, hi = CONTEXTS[2], CONTEXTS[3]
    mid = prof.decode_step(1, 48, 48 * (lo + hi) / 2, False)
    assert prof.decode_step(1, 32, 32 * lo, False) < mid < prof.decode_step(1, 64, 64 * hi, False)
    with pytest.raises(UserError, match="tp=4"):
        prof.require([1, 4], str(path))


@pytest.mark.parametrize("text, needle", [
    ("tp,batch,ctx,decode_s\n1,1,512,0.01\n", "line 1"),
    ("tp,batch,context,decode_s\n1,1,512,0.01\n1,x,512,0.01\n", "line 3"),
    ("tp,batch,context,decode_s\n1,1,512,-0.01\n", "line 2"),
    ("tp,batch,context,decode_s\n1,1,512,0.01\n1,1,512,0.02\n", "line 3: duplicate"),
    ("tp,batch,context,decode_s\n1,1,512,0.01\n1,2,1024,0.02\n", "no row for batch=1 context=1024"),
    ("tp,batch,context,decode_s\n1,1,512\n", "line 2: expected 4 columns"),
])
def test_malformed_profile_names_the_line(tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UserError, match=needle):
        read_csv(path)
