"""Rollout workloads: seeded long-tailed (log-normal) response lengths, JSONL lengths files, and predictions.

A workload is a list of RL steps, each a list of prompts with the true lengths of their n samples and the
lengths a predictor expects (the scheduler only ever sees the predictions).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from specdraft import jsonfile
from specdraft.errors import UserError

# sigma = ln(10) / z_0.99 puts the p99 at 10x the median: the long tail reported for reasoning-RL rollouts.
DEFAULT_SIGMA = math.log(10.0) / 2.326
DEFAULT_MEDIAN = 3000
# How strongly the n samples of one prompt share their length (correlation of log-lengths). An assumption:
# the samples of one prompt correlate in length, but no published figure gives how strongly; 0.6 leaves a sizeable
# within-prompt spread.
DEFAULT_CORRELATION = 0.6
# Length presets (`simulate --lengths`): (median, sigma, correlation). "deepscaler" is DeepScaleR's 8K stage: its
# report (DeepScaleR-1.5B-Preview, agentica, Feb 2025) gives a mean response that fell from 5,500 to 3,500 tokens
# while training at an 8K cap; with the default sigma (p99 = 10x the median) a median of 2,700 puts the capped mean at
# 3,500 tokens and 13% of the samples at the cap (with rollout.max_response_length = 8192).
LENGTH_PRESETS = {
    "long-tail": (DEFAULT_MEDIAN, DEFAULT_SIGMA, DEFAULT_CORRELATION),
    "deepscaler": (2700, DEFAULT_SIGMA, DEFAULT_CORRELATION),
}


@dataclass(frozen=True)
class LengthModel:
    """Log-normal response lengths: log L = ln(median) + sigma * (sqrt(rho) z_prompt + sqrt(1-rho) z_sample)."""

    median: float = DEFAULT_MEDIAN
    sigma: float = DEFAULT_SIGMA
    cap: int = 16384
    correlation: float = DEFAULT_CORRELATION

    def check(self) -> None:
        if self.median < 1:
            raise UserError(f"median length {self.median} must be >= 1", "e.g. --median 3000")
        if self.sigma < 0:
            raise UserError(f"length sigma {self.sigma} must be >= 0", "e.g. --sigma 0.99 (p99 = 10x median)")
        if not 0 <= self.correlation <= 1:
            raise UserError(f"length correlation {self.correlation} must be in [0, 1]", "e.g. --correlation 0.6")
        if self.cap < 1:
            raise UserError(f"length cap {self.cap} must be >= 1", "set rollout.max_response_length")


@dataclass
class Prompt:
    """One prompt of one RL step: its index, step, prompt length, true and predicted sample lengths."""

    pid: int
    step: int
    prompt_len: int
    lengths: list[int]
    predicted: list[float]
    key: str = ""


Workload = list[list[Prompt]]  # steps x prompts


def _clip(x: float, cap: int) -> int:
    return max(1, min(cap, int(round(x))))


def synthetic(
    model: LengthModel,
    steps: int,
    prompts_per_step: int,
    n: int,
    prompt_len: int,
    seed: int,
    prediction_error: float = 0.2,
) -> Workload:
    """A seeded log-normal workload; predictions are the true lengths times exp(error * N(0,1))."""
    model.check()
    rng = random.Random(f"workload:{seed}")
    noise = random.Random(f"prediction:{seed}")
    mu = math.log(model.median)
    shared, own = math.sqrt(model.correlation), math.sqrt(1.0 - model.correlation)
    out: Workload = []
    pid = 0
    for step in range(steps):
        prompts = []
        for _ in range(prompts_per_step):
            z = rng.gauss(0.0, 1.0)
            lengths = [
                _clip(math.exp(mu + model.sigma * (shared * z + own * rng.gauss(0.0, 1.0))), model.cap)
                for _ in range(n)
            ]
            prompts.append(Prompt(pid, step, prompt_len, lengths, predict(lengths, prediction_error, noise, model.cap)))
            pid += 1
        out.append(prompts)
    return out


def predict(lengths: list[int], error: float, rng: random.Random, cap: int) -> list[float]:
    """A length predictor with multiplicative log-normal error: log-space std ``error`` per sample (0 = oracle)."""
    if error <= 0:
        return [float(x) for x in lengths]
    return [float(min(cap, max(1.0, x * math.exp(error * rng.gauss(0.0, 1.0))))) for x in lengths]


def _parse_lengths_line(raw: str, path: Path, lineno: int) -> dict:
    try:  # the bounded parser: a huge integer or deep nesting is a problem of this line, not a traceback
        obj = jsonfile.parse(raw, f"{path}: line {lineno}")
    except jsonfile.BadJson as err:
        raise UserError(
            f"{path}: line {lineno}: not valid JSON ({err.why})",
            'write one object per line, e.g. {"id": "p1", "lengths": [812, 3410]}',
        ) from None
    if not isinstance(obj, dict):
        raise UserError(
            f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}",
            'write one object per line, e.g. {"id": "p1", "lengths": [812, 3410]}',
        )
    lengths = obj.get("lengths")
    if (
        not isinstance(lengths, list)
        or not lengths
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in lengths)
    ):
        raise UserError(
            f'{path}: line {lineno}: "lengths" must be a non-empty list of positive integers, got {lengths!r}',
            "list the response lengths (tokens) of the prompt's samples",
        )
    for name in ("prompt_length", "predicted"):
        value = obj.get(name)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 1):
            raise UserError(
                f'{path}: line {lineno}: "{name}" must be a positive number, got {value!r}',
                f'drop "{name}" or give a token count',
            )
    key = obj.get("id", "")
    return {
        "key": str(key) if key is not None else "",
        "lengths": lengths,
        "prompt_length": obj.get("prompt_length"),
        "predicted": obj.get("predicted"),
    }


def read_lengths_file(path: str | Path) -> list[dict]:
    """Parse a lengths JSONL file (workload or history); blank lines are skipped."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"lengths file not found: {file}", "pass a JSONL file, one object per prompt")
    rows = []
    with file.open(encoding="utf-8") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if raw.strip():
                rows.append(_parse_lengths_line(raw, file, lineno))
    if not rows:
        raise UserError(f"{file} holds no prompts", 'add lines such as {"id": "p1", "lengths": [812, 3410]}')
    return rows


def load_history(path: str | Path) -> dict[str, float]:
    """History of earlier lengths -> predicted length per prompt id (median of its history); '' = global median."""
    rows = read_lengths_file(path)
    out = {row["key"]: float(statistics.median(row["lengths"])) for row in rows if row["key"]}
    out[""] = float(statistics.median([x for row in rows for x in row["lengths"]]))
    return out


def from_file(
    path: str | Path,
    steps: int,
    prompts_per_step: int,
    n: int,
    prompt_len: int,
    cap: int,
    seed: int,
    prediction_error: float = 0.2,
    history: dict[str, float] | None = None,
) -> Workload:
    """Steps of prompts drawn from a lengths JSONL (shuffled per seed, cycled when the file is short).

    Each prompt's n samples are its first n lengths (cycled when it lists fewer), clipped to the cap.
    Predictions: the line's "predicted", else the history's median for its id, else the noisy-oracle model.
    """
    rows = read_lengths_file(path)
    rng = random.Random(f"file:{seed}")
    noise = random.Random(f"prediction:{seed}")
    order: list[int] = []
    out: Workload = []
    pid = 0
    for step in range(steps):
        prompts = []
        for _ in range(prompts_per_step):
            if not order:
                order = list(range(len(rows)))
                rng.shuffle(order)
            row = rows[order.pop()]
            lengths = [min(cap, row["lengths"][j % len(row["lengths"])]) for j in range(n)]
            if row["predicted"] is not None:
                predicted = [float(min(cap, row["predicted"]))] * n
            elif history is not None:
                guess = history.get(row["key"], history[""])
                predicted = [float(min(cap, guess))] * n
            else:
                predicted = predict(lengths, prediction_error, noise, cap)
            prompts.append(Prompt(pid, step, int(row["prompt_length"] or prompt_len), lengths, predicted, row["key"]))
            pid += 1
        out.append(prompts)
    return out


def with_predictions(workload: Workload, exact: bool) -> Workload:
    """A copy whose predictions are the true lengths (exact) — what the oracle policy schedules with."""
    if not exact:
        return workload
    return [
        [Prompt(p.pid, p.step, p.prompt_len, p.lengths, [float(x) for x in p.lengths], p.key) for p in step]
        for step in workload
    ]


def uniform(steps: int, prompts_per_step: int, n: int, prompt_len: int, length: int) -> Workload:
    """Every sample the same length (the property tests' no-skew workload)."""
    pid = 0
    out: Workload = []
    for step in range(steps):
        row = []
        for _ in range(prompts_per_step):
            row.append(Prompt(pid, step, prompt_len, [length] * n, [float(length)] * n))
            pid += 1
        out.append(row)
    return out
