"""A measured draft in the rollout model: `rollout simulate --acceptance-from RUN_OR_JSON`.

The simulator's speculation model is per-token acceptance a with k drafts, E = (1 - a^(k+1)) / (1 - a) tokens per
verify step (costmodel.expected_accepted). A measured draft gives E directly: `rollout measure`'s accept_len (real
greedy speculative decoding, lossless), or a run folder's metrics.jsonl accept_len (the training-time test's top-1
agreement with the policy, the same quantity on training rows). The a that reproduces the measured E at the
measured k replaces rollout.acceptance_rate; the rest (decode step costs, batching, the trainer) stays modelled.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace

from specdraft.errors import UserError
from specdraft.fsutil import read_regular_text
from specdraft.rollout.model.costmodel import expected_accepted
from specdraft.spec.schema import LayoutSpec

MAX_JSON_BYTES = 1 << 20
MAX_METRICS_BYTES = 64 << 20
LAST_ROWS = 5  # a run's figure: the mean accept_len over its last co-training steps (one step is noisy)


@dataclass(frozen=True)
class MeasuredDraft:
    accept_len: float  # tokens per verify step (accepted drafts + the bonus token)
    k: int  # draft tokens per verify step it was measured with
    kind: str  # "decoding" (rollout measure) or "training" (a run's TTT metrics)
    source: str

    @property
    def per_token_acceptance(self) -> float:
        return per_token_acceptance(self.accept_len, self.k)

    def to_dict(self) -> dict:
        return {
            "accept_len": self.accept_len,
            "k": self.k,
            "kind": self.kind,
            "source": self.source,
            "per_token_acceptance": round(self.per_token_acceptance, 6),
        }


def per_token_acceptance(accept_len: float, k: int) -> float:
    """The a in [0, 1) with (1 - a^(k+1)) / (1 - a) = accept_len (bisection; E rises monotonically with a)."""
    target = min(max(accept_len, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0 - 1e-9
    if expected_accepted(hi, k) <= target:
        return hi
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_accepted(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def read(path: str) -> MeasuredDraft:
    """A `rollout measure --format json` file, or a run folder (its metrics.jsonl)."""
    if os.path.isdir(path):
        return _from_run(path)
    text = read_regular_text(path, MAX_JSON_BYTES, "--acceptance-from file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(
            f"--acceptance-from {path} is not JSON ({err})",
            "pass `specdraft rollout measure RUN --format json` output, or a run folder",
        ) from None
    if (
        not isinstance(data, dict)
        or not _number(data.get("accept_len"))
        or not isinstance(data.get("k"), int)
        or isinstance(data.get("k"), bool)
        or data["k"] < 1
    ):
        raise UserError(
            f"--acceptance-from {path} has no accept_len (a number) and k (an integer >= 1)",
            "pass `specdraft rollout measure RUN --format json` output",
        )
    return MeasuredDraft(float(data["accept_len"]), data["k"], "decoding", path)


def _from_run(folder: str) -> MeasuredDraft:
    metrics = os.path.join(folder, "metrics.jsonl")
    if not os.path.exists(metrics):
        raise UserError(
            f"--acceptance-from {folder}: no metrics.jsonl there",
            "name a run folder that trained a draft, or a `rollout measure --format json` file",
        )
    rows = []
    for line in read_regular_text(metrics, MAX_METRICS_BYTES, "metrics file").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(row, dict)
            and _number(row.get("accept_len"))
            and isinstance(row.get("acceptance"), list)
            and row["acceptance"]
        ):
            rows.append(row)
    if not rows:
        raise UserError(
            f"--acceptance-from {folder}: its metrics.jsonl has no co-training step with an accept_len",
            "let the run train its draft past training.warmup_steps",
        )
    last = rows[-LAST_ROWS:]
    return MeasuredDraft(
        sum(r["accept_len"] for r in last) / len(last),
        len(last[-1]["acceptance"]),
        "training",
        f"{folder} (metrics.jsonl, steps {last[0].get('step')}-{last[-1].get('step')})",
    )


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def with_measured(spec: LayoutSpec, measured: MeasuredDraft) -> LayoutSpec:
    """``spec`` whose rollout speculates with the measured draft: its k and the a that gives its accept_len."""
    return replace(
        spec,
        rollout=replace(
            spec.rollout,
            speculative=True,
            num_speculative_tokens=measured.k,
            acceptance_rate=measured.per_token_acceptance,
        ),
    )


def without_speculation(spec: LayoutSpec) -> LayoutSpec:
    return replace(spec, rollout=replace(spec.rollout, speculative=False))


def speedups(with_spec: dict, without: dict) -> dict:
    """Per policy: iteration time and generation makespan without speculation / with the measured draft."""
    out = {}
    for policy, rec in with_spec["policies"].items():
        base = without["policies"].get(policy)
        if base is None:
            continue
        out[policy] = {
            "iteration_time_s": {
                "speculative": rec["iteration_time_s"]["mean"],
                "none": base["iteration_time_s"]["mean"],
            },
            "makespan_s": {"speculative": rec["makespan_s"]["mean"], "none": base["makespan_s"]["mean"]},
            "iteration_speedup": base["iteration_time_s"]["mean"] / rec["iteration_time_s"]["mean"],
            "generation_speedup": base["makespan_s"]["mean"] / rec["makespan_s"]["mean"],
        }
    return out
