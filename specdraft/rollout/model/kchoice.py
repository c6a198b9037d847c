"""How many tokens to draft: the k that maximises expected tokens per second at a running batch, from the draft's
per-position acceptance and the cost of a step (k draft forwards and a (k+1)-token verify), as vLLM's
`num_speculative_tokens_per_batch_size` schedule (k 0 where speculation costs)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

KSchedule = tuple[tuple[int, int, int], ...]
"""vLLM's num_speculative_tokens_per_batch_size: (first batch, last batch, k), inclusive, from batch 1 up."""


def tokens_per_verify(acceptance: Sequence[float], k: int) -> float:
    """Expected tokens a sequence gains per verify step with k drafts: 1 + the first k positions' acceptance.

    ``acceptance[j]`` is vLLM's per-position rate (spec_decode_num_accepted_tokens_per_pos / num_drafts): the share
    of verify steps whose draft j+1 was accepted, which needs drafts 1..j accepted too, so it is already the
    probability of the whole prefix and the sum counts each accepted token once (the 1 is the target's own token).
    """
    return 1.0 + sum(acceptance[:k])


def best_k(
    acceptance: Sequence[float], step_s: Callable[[int], float], max_k: int, allowed: Optional[frozenset] = None
) -> int:
    """argmax over k in 0..max_k (and in ``allowed``, when given) of tokens_per_verify(k) / step_s(k); the smaller k
    on a tie (fewer draft forwards for the same rate). k beyond the measured positions counts them as never
    accepted. 0 is always allowed: not speculating is always possible."""
    padded = list(acceptance) + [0.0] * max(0, max_k - len(acceptance))
    best, best_rate = 0, 1.0 / step_s(0)
    for k in range(1, max_k + 1):
        if allowed is not None and k not in allowed:
            continue
        rate = tokens_per_verify(padded, k) / step_s(k)
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = k, rate
    return best


def k_schedule(
    acceptance: Sequence[float],
    costs: Sequence[tuple[int, Sequence[float]]],
    max_k: int,
    max_batch: int,
    allowed: Optional[frozenset] = None,
) -> KSchedule:
    """The k for every running batch 1..max_batch, as merged ranges.

    ``costs`` is a table of (batch, step seconds for k = 0..max_k) at increasing batches; a batch between two
    rows takes the k of the next row up (the larger batch, where speculation pays less), one past the last row
    the last row's. ``allowed``: the k an engine can switch to (best_k).
    """
    if not costs:
        raise ValueError("k_schedule needs at least one (batch, step costs) row")
    choices = [(batch, best_k(acceptance, seconds.__getitem__, max_k, allowed)) for batch, seconds in costs]
    ranges: list[list[int]] = []
    start = 1
    for i, (batch, k) in enumerate(choices):
        end = max_batch if i == len(choices) - 1 else min(batch, max_batch)
        if end < start:
            continue
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, k])
        start = end + 1
        if start > max_batch:
            break
    return tuple((a, b, k) for a, b, k in ranges)


def batch_points(max_batch: int) -> tuple[int, ...]:
    """Batches the cost table samples: powers of two up to max_batch, and max_batch itself."""
    points, b = [], 1
    while b < max_batch:
        points.append(b)
        b *= 2
    return (*points, max_batch)


def model_costs(cost: Any, tp: int, mean_context: float, max_k: int) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """The cost table from the calibrated model (a costmodel.CostModel; not imported: the runtime imports this module
    and reads the plan's table instead): a step of ``batch`` sequences of ``mean_context`` tokens each, with
    k drafts (k forwards of the draft and a (k+1)-token verify) or none, at batch_points(max_num_seqs)."""
    rows = []
    for batch in batch_points(cost.max_num_seqs):
        seconds = [cost.decode_step(tp, batch, batch * mean_context, False)]
        for k in range(1, max_k + 1):
            at_k = dataclasses.replace(cost, num_speculative_tokens=k)
            seconds.append(at_k.decode_step(tp, batch, batch * mean_context, True))
        rows.append((batch, tuple(seconds)))
    return tuple(rows)


def geometric(acceptance_rate: float, max_k: int) -> tuple[float, ...]:
    """Per-position acceptance when each draft token is accepted with the same probability: a, a^2, ..."""
    return tuple(acceptance_rate ** (j + 1) for j in range(max_k))
