"""Aggregate per-seed simulation runs into the reported figures: means with Student-t 95% intervals."""

from __future__ import annotations

import math
import statistics

# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond 30 the normal 1.96 is within 2%.
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def mean_ci(values: list[float]) -> dict:
    """{"mean", "ci95"}: the half-width of the 95% confidence interval of the mean over seeds (0 for one seed)."""
    vals = [float(v) for v in values if not math.isnan(v)]
    if not vals:
        return {"mean": math.nan, "ci95": math.nan}
    mean = statistics.fmean(vals)
    if len(vals) < 2:
        return {"mean": mean, "ci95": 0.0}
    df = len(vals) - 1
    t = _T95[df - 1] if df <= len(_T95) else 1.96
    return {"mean": mean, "ci95": t * statistics.stdev(vals) / math.sqrt(len(vals))}


def summarize_policy(runs: list) -> dict:
    """The JSON record of one policy over seeds (simulator.RunResult each)."""
    return {
        "iteration_time_s": mean_ci([r.iteration_time_s for r in runs]),
        "makespan_s": mean_ci([r.makespan_s for r in runs]),
        "bubbles": {k: statistics.fmean(r.bubbles[k] for r in runs) for k in ("padding", "skewness", "sorting")},
        "tokens_per_gpu_s": statistics.fmean(r.tokens_per_gpu_s for r in runs),
        "trainer_idle_s": statistics.fmean(r.trainer_idle_s for r in runs),
        "max_policy_lag": max(r.max_policy_lag for r in runs),
        "mean_policy_lag": statistics.fmean(r.mean_policy_lag for r in runs),
        "preemptions": statistics.fmean(r.preemptions for r in runs),
    }


def relative(value: float, base: float) -> float:
    """value / base - 1 (negative = faster than the base)."""
    return value / base - 1.0 if base else math.nan


def spread(values: list[float]) -> dict:
    """`mean_ci` plus the spread over seeds: standard deviation, smallest and largest value."""
    vals = [float(v) for v in values if not math.isnan(v)]
    out = mean_ci(vals)
    out["std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    out["min"] = min(vals) if vals else math.nan
    out["max"] = max(vals) if vals else math.nan
    return out
