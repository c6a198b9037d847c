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

from specdraft.errors import UserError, echo, shorten
from specdraft.fsutil import read_regular_text
from specdraft.rollout.model.costmodel import expected_accepted
from specdraft.runs import files as runfiles
from specdraft.runs.paths import MAX_METRICS_BYTES, METRICS
from specdraft.spec.bounds import INT_RANGES
from specdraft.spec.schema import LayoutSpec

MAX_JSON_BYTES = 1 << 20
MAX_K = INT_RANGES["rollout.num_speculative_tokens"][1]  # the layout's own bound on draft tokens per step
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
    fix = "pass `specdraft rollout measure RUN --format json` output, or a run folder"
    try:  # a file the user names, not a run file: its numbers are bounded field by field below
        data = json.loads(text)
    except (ValueError, RecursionError) as err:  # ValueError: JSONDecodeError, or an integer of 4,300+ digits
        raise UserError(
            f"--acceptance-from {path} is not JSON a measurement holds ({shorten(str(err))})", fix
        ) from None
    if not isinstance(data, dict) or "accept_len" not in data or "k" not in data:
        raise UserError(f"--acceptance-from {path} has no accept_len and k", fix)
    k = _checked_k(data["k"], f"--acceptance-from {path}: k")
    accept_len = _checked_accept_len(data["accept_len"], k, f"--acceptance-from {path}: accept_len")
    if "acceptance" in data:
        _check_rates(data["acceptance"], f"--acceptance-from {path}: acceptance")
    return MeasuredDraft(accept_len, k, "decoding", path)


def _from_run(folder: str) -> MeasuredDraft:
    text = runfiles.read_text(folder, METRICS, MAX_METRICS_BYTES)
    if text is None:
        raise UserError(
            f"--acceptance-from {folder}: no {METRICS} there",
            "name a run folder that trained a draft, or a `rollout measure --format json` file",
        )
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            row = runfiles.parse_json(line, METRICS)
        except runfiles.BadRunFile:
            continue  # not a step's row (a line cut short by a crash, say): as the run's own readers skip it
        if not isinstance(row, dict) or row.get("accept_len") is None or not isinstance(row.get("acceptance"), list):
            continue  # a policy warm-up step, or a row of another shape: it measures no draft
        where = f"--acceptance-from {os.path.join(folder, METRICS)} line {number}"
        rates = _check_rates(row["acceptance"], f"{where}: acceptance")
        k = _checked_k(len(rates), f"{where}: len(acceptance) (the k it was measured with)")
        rows.append((_checked_accept_len(row["accept_len"], k, f"{where}: accept_len"), k, row.get("step")))
    if not rows:
        raise UserError(
            f"--acceptance-from {folder}: its {METRICS} has no co-training step with an accept_len",
            "let the run train its draft past training.warmup_steps",
        )
    last = rows[-LAST_ROWS:]
    return MeasuredDraft(
        sum(accept_len for accept_len, _, _ in last) / len(last),
        last[-1][1],
        "training",
        f"{folder} ({METRICS}, steps {echo(last[0][2])}-{echo(last[-1][2])})",
    )


# Every number of a measurement is bounded before any arithmetic: an accept_len of 1e308, or one below the target's
# own token, would otherwise become a projected speedup.
FIX = "a measurement specdraft wrote never holds this: measure again (`specdraft rollout measure RUN --format json`)"


def _finite(value) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def _checked_k(value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_K:
        raise UserError(
            f"{where} = {echo(value)}: must be an integer in 1..{MAX_K} (draft tokens per verify step)", FIX
        )
    return value


def _checked_accept_len(value, k: int, where: str) -> float:
    if not _finite(value) or not 1 <= value <= k + 1:
        raise UserError(
            f"{where} = {echo(value)}: must be a finite number in 1..{k + 1} at k = {k} (the target's own token plus "
            "at most k accepted drafts per verify step)",
            FIX,
        )
    return float(value)


def _check_rates(values, where: str) -> list:
    if not isinstance(values, list) or not values or len(values) > MAX_K:
        got = f" (it has {len(values):,})" if isinstance(values, list) else ""
        raise UserError(f"{where} = {echo(values)}: must be a list of 1..{MAX_K} acceptance rates{got}", FIX)
    for i, rate in enumerate(values):
        if not _finite(rate) or not 0 <= rate <= 1:
            raise UserError(f"{where}[{i}] = {echo(rate)}: must be a finite rate in [0, 1]", FIX)
    return values


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
