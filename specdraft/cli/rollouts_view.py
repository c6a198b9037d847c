"""`specdraft rollouts RUN [--step N] [--format text|json]`: a GRPO run's recorded samples with their rewards.

The samples' text comes from the run folder (the policy wrote it): it reaches the terminal through cli.terminal's
`plain`, so no escape sequence in a response can act on the terminal.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from specdraft.cli.terminal import plain

RunArg = typer.Argument(
    None, metavar="[RUN]", help="A run folder's path, or its name under runs/ (default: the most recent run)."
)
INDENT = " " * 14


def rollouts(
    run: Optional[str] = RunArg,
    step: Optional[int] = typer.Option(
        None, "--step", help="The N-th step (as `status` counts, from 1); default: the newest recorded step."
    ),
    format: str = typer.Option("text", "--format", "-f", help="text, or json (the file's records of that step)."),
) -> None:
    """Print a GRPO run's recorded samples of one step: prompt, response and reward (rl/rollouts.jsonl)."""
    from specdraft.errors import UserError
    from specdraft.runs.paths import ROLLOUTS
    from specdraft.runs.rollouts import as_json, read_rollouts
    from specdraft.runs.rundir import resolve_run

    if format not in ("text", "json"):
        raise UserError(f"--format {format!r} is not supported", "use --format text or --format json")
    folder, _, _ = resolve_run(run)
    found = read_rollouts(folder)
    if found is None or not found.steps:
        raise UserError(
            f"{folder / ROLLOUTS} {'holds no step' if found is not None else 'does not exist'}: the run recorded no "
            "rollouts",
            "rollouts are recorded by the grpo workload (launch --workload grpo), from its first RL step on",
        )
    recorded = [s + 1 for s in found.steps]
    index = (step - 1) if step is not None else max(found.steps)
    if index not in found.steps:
        shown = ", ".join(map(str, recorded[:10])) + (f" ... {recorded[-1]}" if len(recorded) > 10 else "")
        raise UserError(f"--step {step} is not recorded in {folder / ROLLOUTS}", f"use one of the steps: {shown}")
    entry = found.steps[index]
    if format == "json":
        # one record a line, inside one JSON array
        sys.stdout.write("[\n" + ",\n".join(json.dumps(r) for r in as_json(entry)) + "\n]\n")
        return
    out = sys.stdout
    rewards = [s.reward for s in entry.samples if s.reward is not None]
    mean = f", reward mean {sum(rewards) / len(rewards):.4f}" if rewards else ""
    versions = sorted({s.policy_version for s in entry.samples if s.policy_version is not None})
    policy = f", policy version {', '.join(map(str, versions))}" if versions else ""
    which = "" if step is not None else f" (the newest of {len(recorded)} recorded; --step N shows another)"
    out.write(f"step {index + 1}{which}: {len(entry.samples)} sample(s){mean}{policy}\n")
    if entry.error is not None:
        out.write(f"  the reward failed: {plain(entry.error, one_line=True)}\n")
    if entry.ids_only and entry.samples:
        out.write("  (token ids only: this run's rollouts.jsonl was written before samples carried their text)\n")
    for i, s in enumerate(entry.samples):
        head = [f"#{i}", f"prompt {s.prompt_index if s.prompt_index is not None else '?'}"]
        if s.instance is not None:
            head.append(f"instance {s.instance}")
        head.append(f"reward {s.reward:.4f}" if s.reward is not None else "reward ?")
        if s.finished is not None:
            head.append("finished" if s.finished else "cut at the length limit")
        out.write("  " + "  ".join(head) + "\n")
        if entry.ids_only or (s.prompt_text is None and s.response_text is None):
            out.write(f"    response ids: {list(s.response_ids)}\n")
            continue
        for label, text in (("prompt", s.prompt_text), ("response", s.response_text), ("answer", s.answer)):
            if text is not None:
                body = plain(text).replace("\n", "\n" + INDENT)
                out.write(f"    {label + ':':<10}{body}\n")
    if found.skipped:
        out.write(f"note: {found.skipped} line(s) of {ROLLOUTS} are not records the runtime writes; skipped\n")
    if found.truncated:
        out.write(f"note: only the newest part of {ROLLOUTS} was read (it is larger than the bound)\n")


def register(app) -> None:
    app.command()(rollouts)
