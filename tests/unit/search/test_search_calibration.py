"""The estimate against NVIDIA's published H100 Megatron throughput (benchmarks/calibration_h100.yaml): within
+-20% of tokens/s/GPU for every point, and the published layout among the search's top 3 distinct layouts for the
point's model, GPU count, batch sizes (global and micro) and sequence length.

The ranking target is met for the points below that are not marked; the strict xfails record, point by point, the
layout the search prefers, by how much and which term separates them (docs/search.md, "Calibration"). No constant is
fitted per point.
"""

from __future__ import annotations

import pytest

from specdraft.search.calibration import load_points, published_estimate, published_rank
from tests.support.paths import REPO

POINTS = load_points(REPO / "benchmarks" / "calibration_h100.yaml")
TOLERANCE = 0.20
# Points whose published layout the search does not put in its top 3: the layout it prefers and the reason.
RANK_MISSES = {
    "gpt3-175b-128": "rank 4: pp4 (vp 12, 24) 1.0% faster at 71.4 GiB (89.7%): GPTConfig175B has no dropout masks",
    "llama2-13b-16": "rank 9: pp2 (vp 7, 10, 5, ...) 2.1% faster; the LM head (0.57 layer) weighs on pp4's last stage",
    "llama2-70b-64": "rank 8: tp4 pp2 (vp 10, 20, 8, ...) 1.2% faster; vp20's 164 exposed warm-up/flush sends (1.5%)",
    "nemotron3-22b-64": "pp1 cp2 27% faster: the 256K-vocabulary head (3.8 layers) makes pp4's last stage 38% slower",
    "nemotron4-340b-128": "published layout without recompute needs 94% of HBM: the search passes over >90%",
    "llama3-70b-64-cp2": "rank 23: pp2 cp2 (vp 10, 8, ...) 3.4% faster; the 128K head (1.27 layers) on the last of pp4",
    "llama3-70b-64-gbs128": "pp2 cp2 vp10 8.6% faster: pp8's last stage holds 10 layers and the 128K head (+12.8%)",
    "llama3-70b-64-gbs256": "pp2 cp2 vp10 7.7% faster: pp8's last stage holds 10 layers and the 128K head (+12.8%)",
    "qwen3-30b-a3b-16": "MoE: ep1 pp4 2.2x faster; no all-to-all and the expert GEMMs of 128 local experts uncosted",
    "qwen3-235b-a22b-256": "MoE: ep2 pp32 2.2x faster; the all-to-all (59 s of 93 s) dominates, its overlap unmodelled",
}


@pytest.mark.parametrize("point", POINTS, ids=[p.id for p in POINTS])
def test_estimate_within_20_percent_of_published(point):
    row = published_estimate(point)
    assert row is not None, "the published layout must pass validation"
    error = row.estimate.tokens_per_s_per_gpu / point.tokens_per_s_per_gpu - 1
    assert abs(error) <= TOLERANCE, (
        f"{point.id}: estimate {row.estimate.tokens_per_s_per_gpu:.0f} vs "
        f"published {point.tokens_per_s_per_gpu:.0f} ({error:+.1%})"
    )


@pytest.mark.parametrize(
    "point",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=RANK_MISSES[p.id])) if p.id in RANK_MISSES else p
        for p in POINTS
    ],
    ids=[p.id for p in POINTS],
)
def test_published_layout_ranks_in_the_top_3(point):
    rank, keys, _ = published_rank(point)
    assert rank is not None and rank <= 3, f"{point.id}: published {point.key} not in the top 3 {keys[:3]}"
