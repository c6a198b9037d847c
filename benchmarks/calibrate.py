"""Fit the step-time estimate's efficiency constants to NVIDIA's published H100 Megatron throughput, and report.

    .venv/bin/python benchmarks/calibrate.py            # the table with the shipped constants (docs/search.md figures)
    .venv/bin/python benchmarks/calibrate.py --fit      # refit: coordinate descent on the mean squared log error

The fit is one set of constants for every point (no constant per point). gemm_bf16 is a measurement (an 8192^3
bf16 matmul on an H200), not fitted: every published H100 point here is FP8.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.perf.estimate import CALIBRATED, Estimator
from specdraft.search.calibration import load_points, point_spec, published_rank, published_variants

POINTS = Path(__file__).with_name("calibration_h100.yaml")
# Only the two kernel efficiencies are fitted. Which TP and pipeline sends stay exposed follows megatron-core's
# schedules and TransformerEngine's overlap (specdraft.perf.costs, specdraft.perf.estimate), with each point's
# recipe settings; the DP overlap fraction, the link efficiencies and the knees stay at their priors.
FITTED = {"gemm_fp8": (0.3, 0.8), "attention": (0.2, 0.8)}  # name: (low, high)


def _variants(points):
    """Per point: (spec, layouts of its verified published-field variants); the rules alone decide which pass."""
    return [(point, point_spec(point), [r.layout for r in published_variants(point)]) for point in points]


def _estimates(variants, eff) -> list[float]:
    """Per point: the best estimate (tokens/s/GPU) among its published-field variants."""
    out = []
    for _point, spec, layouts in variants:
        est = Estimator(spec, eff)
        out.append(max((est.estimate(lay).tokens_per_s_per_gpu for lay in layouts), default=float("nan")))
    return out


def _loss(variants, eff) -> float:
    """Mean squared log error against the published tokens/s/GPU."""
    errs = [
        math.log(e / p.tokens_per_s_per_gpu) ** 2 for (p, _, _), e in zip(variants, _estimates(variants, eff)) if e == e
    ]
    return sum(errs) / len(errs)


def fit(variants, eff, rounds: int = 6):
    """Coordinate descent: each constant in turn on a shrinking grid inside its bounds."""
    best = _loss(variants, eff)
    for r in range(rounds):
        for name, (low, high) in FITTED.items():
            span = (high - low) / (3**r)
            centre = getattr(eff, name)
            for step in range(-6, 7):
                value = min(high, max(low, centre + span * step / 6))
                trial = dataclasses.replace(eff, **{name: value})
                loss = _loss(variants, trial)
                if loss < best:
                    best, eff = loss, trial
        print(f"round {r}: rms log error {math.sqrt(best):.4f}", file=sys.stderr)
    return eff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the constants and print them")
    parser.add_argument("--no-rank", action="store_true", help="skip the per-point searches (ranks)")
    args = parser.parse_args()
    points = load_points(POINTS)
    started = time.perf_counter()
    variants = _variants(points)
    eff = CALIBRATED
    if args.fit:
        eff = fit(variants, eff)
        print("fitted:", {name: round(getattr(eff, name), 4) for name in FITTED})
    print(
        "| point | GPUs | layout (tp pp cp vp ep mbs) | published tokens/s/GPU | estimate | error | search rank "
        "| search's best (its estimate) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for (point, _spec, _layouts), estimate in zip(variants, _estimates(variants, eff)):
        error = estimate / point.tokens_per_s_per_gpu - 1
        errors.append(abs(error))
        tp, pp, cp, vpp, ep, mbs = point.key
        rank, best = "-", "-"
        if not args.no_rank:
            found, keys, top = published_rank(point, eff)
            rank = found or ">5"
            best = f"{' '.join(str(v or '-') for v in keys[0])} ({top:,.0f})"
        print(
            f"| {point.id} | {point.gpus} | {tp} {pp} {cp} {vpp or '-'} {ep} {mbs} | "
            f"{point.tokens_per_s_per_gpu:,.0f} | {estimate:,.0f} | {error:+.1%} | {rank} | {best} |"
        )
    print(
        f"\nmean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}; {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
