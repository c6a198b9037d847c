"""The estimate against NVIDIA's published H100 Megatron throughput (benchmarks/calibration_h100.yaml): within
+-20% of tokens/s/GPU for every point, and the published layout among the search's top 3 distinct layouts.

The ranking target is met for the points below that are not marked; the strict xfails record, point by point, where
the search ranks another layout first, and by how much (README, "Calibration"). No constant is fitted per point.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdraft.search.calibration import load_points, published_estimate, published_rank

POINTS = load_points(Path(__file__).parents[1] / "benchmarks" / "calibration_h100.yaml")
TOLERANCE = 0.20
# Points whose published layout the search does not put in its top 3, with the layout it prefers instead.
RANK_MISSES = {
    "gpt3-175b-512": "tp4 pp4 vp4 estimated 1% faster",
    "llama2-13b-16": "tp2 pp1 mbs2 estimated 2% faster",
    "llama2-70b-64": "tp2 pp4 cp2 vp5 estimated 5% faster",
    "nemotron3-8b-64": "tp1 mbs1 estimated 4% faster",
    "nemotron3-22b-64": "tp2 pp1 estimated 33% faster: the 256K-vocabulary head weighs on pp4's last stage",
    "nemotron4-340b-128": "the published layout needs full recompute in specdraft's memory estimate",
    "llama3-70b-64-cp2": "tp4 pp2 cp2 vp5 estimated 4% faster",
    "llama3-70b-64-gbs128": "tp4 pp2 cp2 vp5 estimated 9% faster",
    "llama3-70b-64-gbs256": "tp4 pp2 cp2 vp4 estimated 9% faster",
    "llama3.1-405b-1024-gbs1536": "tp4 pp16 cp4 vp4 estimated 2% faster",
    "qwen3-30b-a3b-16": "MoE: no expert parallelism (pp4) estimated 2x faster; the all-to-all dominates the estimate",
    "qwen3-235b-a22b-256": "MoE: ep1 pp32 estimated 2x faster; the all-to-all dominates the estimate",
}


@pytest.mark.parametrize("point", POINTS, ids=[p.id for p in POINTS])
def test_estimate_within_20_percent_of_published(point):
    row = published_estimate(point)
    assert row is not None, "the published layout must pass validation"
    error = row.estimate.tokens_per_s_per_gpu / point.tokens_per_s_per_gpu - 1
    assert abs(error) <= TOLERANCE, f"{point.id}: estimate {row.estimate.tokens_per_s_per_gpu:.0f} vs " \
                                    f"published {point.tokens_per_s_per_gpu:.0f} ({error:+.1%})"


@pytest.mark.parametrize("point", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=RANK_MISSES[p.id])) if p.id in RANK_MISSES else p
    for p in POINTS], ids=[p.id for p in POINTS])
def test_published_layout_ranks_in_the_top_3(point):
    rank, keys, _ = published_rank(point)
    assert rank is not None and rank <= 3, f"{point.id}: published {point.key} not in the top 3 {keys[:3]}"
