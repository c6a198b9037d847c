"""RUN/rl/rollouts.jsonl read back (the GRPO loop writes it): one object per sample ({step, instance, policy_version,
prompt_index, prompt_text, response_text, answer, reward, prompt_ids, response_ids, finished}), one {step, error}
per step whose reward failed, or, in runs of older specdrafts, one {step, rollouts: [[prompt_index, response_ids,
reward], ...]} per step (token ids only). Read through runs.files (no link, bounded), as untrusted: a line of
another shape is counted and skipped, never an error; keys a reader does not know are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from specdraft.runs import files as runfiles
from specdraft.runs.paths import MAX_ROLLOUTS_BYTES, ROLLOUTS


@dataclass(frozen=True)
class Sample:
    """One response and its reward; the text fields are None in an ids-only (older) record."""

    step: int
    prompt_index: int | None
    reward: float | None
    response_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    response_text: str | None = None
    answer: str | None = None
    instance: int | None = None
    policy_version: int | None = None
    finished: bool | None = None
    extra: dict = field(default_factory=dict)  # keys of newer writers, passed through to --format json


@dataclass
class StepRollouts:
    """Everything recorded for one step (the file's 0-based ``step``)."""

    step: int
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    ids_only: bool = False


@dataclass
class Rollouts:
    steps: dict[int, StepRollouts]  # by the file's step, in step order
    skipped: int  # lines of another shape (or cut by the bound, or being written)
    truncated: bool  # the file is larger than the bound: its oldest steps are not read


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reward(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _ids(value) -> tuple[int, ...] | None:
    return tuple(value) if isinstance(value, list) and all(map(_int, value)) else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


KNOWN = frozenset(Sample.__dataclass_fields__) - {"extra"}


def _sample(row: dict) -> Sample | None:
    """A per-sample row; None when it lacks what every sample has (a step, a reward, response ids or text)."""
    response = _ids(row.get("response_ids"))
    text = _text(row.get("response_text"))
    if "reward" not in row or (response is None and text is None):
        return None
    return Sample(
        step=row["step"],
        prompt_index=row.get("prompt_index") if _int(row.get("prompt_index")) else None,
        reward=_reward(row.get("reward")),
        response_ids=response or (),
        prompt_ids=_ids(row.get("prompt_ids")),
        prompt_text=_text(row.get("prompt_text")),
        response_text=text,
        answer=_text(row.get("answer")),
        instance=row.get("instance") if _int(row.get("instance")) else None,
        policy_version=row.get("policy_version") if _int(row.get("policy_version")) else None,
        finished=row.get("finished") if isinstance(row.get("finished"), bool) else None,
        extra={k: v for k, v in row.items() if k not in KNOWN},
    )


def _old_samples(step: int, entries) -> list[Sample] | None:
    """An older writer's [[prompt_index, response_ids, reward], ...]; None when it is not that."""
    out = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3 and _int(entry[0]) and _ids(entry[1]) is not None):
            return None
        out.append(
            Sample(step=step, prompt_index=entry[0], reward=_reward(entry[2]), response_ids=_ids(entry[1]) or ())
        )
    return out


def read_rollouts(run_dir: str | Path) -> Rollouts | None:
    """The newest MAX_ROLLOUTS_BYTES of RUN/rl/rollouts.jsonl by step; None when the run wrote none. A step
    recorded again after later steps (a run resumed without its file rewound) keeps its newest record."""
    got = runfiles.read_range(run_dir, ROLLOUTS, -MAX_ROLLOUTS_BYTES, MAX_ROLLOUTS_BYTES)
    if got is None:
        return None
    data, size = got
    lines = data.split(b"\n")
    truncated = size > len(data)
    if truncated:
        lines = lines[1:]  # cut by the bound
    steps: dict[int, StepRollouts] = {}
    skipped, previous = 0, None
    for line in lines:
        if not line.strip():
            continue
        try:
            row = runfiles.parse_json(line, ROLLOUTS)
        except runfiles.BadRunFile:
            skipped += 1
            continue
        if not isinstance(row, dict) or not _int(row.get("step")) or row["step"] < 0:
            skipped += 1
            continue
        step = row["step"]
        if step != previous and step in steps:
            del steps[step]  # recorded again: the newer record replaces the older
        previous = step
        entry = steps.setdefault(step, StepRollouts(step))
        if isinstance(row.get("error"), str):
            entry.error = row["error"]
        elif "rollouts" in row:
            old = _old_samples(step, row["rollouts"]) if isinstance(row["rollouts"], list) else None
            if old is None:
                skipped += 1
                continue
            entry.samples += old
            entry.ids_only = True
        else:
            sample = _sample(row)
            if sample is None:
                skipped += 1
                continue
            entry.samples.append(sample)
    return Rollouts({s: steps[s] for s in sorted(steps)}, skipped, truncated)


def as_json(entry: StepRollouts) -> list[dict]:
    """A step's records as the file holds them (the contract's keys, then any others)."""
    if entry.error is not None and not entry.samples:
        return [{"step": entry.step, "error": entry.error}]
    out: list[dict] = []
    for s in entry.samples:
        row: dict = {
            "step": s.step,
            "prompt_index": s.prompt_index,
            "reward": s.reward,
            "response_ids": list(s.response_ids),
        }
        if not entry.ids_only:
            row |= {
                "instance": s.instance,
                "policy_version": s.policy_version,
                "prompt_text": s.prompt_text,
                "response_text": s.response_text,
                "answer": s.answer,
                "prompt_ids": None if s.prompt_ids is None else list(s.prompt_ids),
                "finished": s.finished,
                **s.extra,
            }
        out.append(row)
    if entry.error is not None:
        out.append({"step": entry.step, "error": entry.error})
    return out
