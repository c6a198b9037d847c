"""A GRPO run in the terminal: its RL steps' figures (reward, response length, the engine's accept length and
per-position acceptance, refit and step seconds) and, once metrics rows carry them, each rollout instance's.

metrics.jsonl is written by the ranks and read as untrusted: a missing or odd value shows as `-`, never an error.
"""

from __future__ import annotations

from rich.table import Table

from specdraft.cli.terminal import safe

MAX_POSITIONS = 8  # per-position acceptance columns shown (k is rarely larger)
INSTANCE_FIELDS = ("samples", "generated_tokens", "busy_s", "idle_s", "accept_length", "refit_s")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(value, fmt: str) -> str:
    return format(value, fmt) if _number(value) else "-"


def is_grpo(rows: list[dict], workload: str | None = None) -> bool:
    """True for a GRPO run: its workload says so, or a metrics row is a GRPO step."""
    return workload == "grpo" or any(r.get("phase") == "grpo" for r in rows)


def grpo_rows(rows: list[dict]) -> list[dict]:
    """The RL steps' rows (phase grpo) with an integer step."""
    return [r for r in rows if r.get("phase") == "grpo" and isinstance(r.get("step"), int)]


def engine_of(row: dict) -> dict:
    found = row.get("engine")
    return found if isinstance(found, dict) else {}


def per_position(row: dict) -> list:
    found = engine_of(row).get("acceptance_per_pos")
    return found[:MAX_POSITIONS] if isinstance(found, list) else []


def picks(count: int) -> list[int]:
    """The first, quartile, middle and last indices of ``count`` rows."""
    return sorted({0, count // 4, count // 2, 3 * count // 4, count - 1}) if count else []


def steps_table(rows: list[dict]) -> Table | None:
    """Reward, response length, the engine's accept length and acceptance per draft position, refit and step
    seconds, at the first, quartile and last RL steps; None before the first RL step."""
    rl = grpo_rows(rows)
    if not rl:
        return None
    chosen = [rl[i] for i in picks(len(rl))]
    positions = max((len(per_position(r)) for r in chosen), default=0)
    table = Table(title=f"GRPO: {len(rl)} RL step(s) (engine accept length: tokens per verify step)")
    for name in ("step", "reward", "±std", "resp len", "accept len"):
        table.add_column(name, justify="right")
    for j in range(positions):
        table.add_column(f"accept@{j + 1}", justify="right")
    for name in ("tok/fwd", "draft loss", "refit s", "step s"):
        table.add_column(name, justify="right")
    for r in chosen:
        engine, pos = engine_of(r), per_position(r)
        table.add_row(
            str(r["step"] + 1),
            _num(r.get("reward_mean"), ".3f"),
            _num(r.get("reward_std"), ".3f"),
            _num(r.get("response_length"), ".1f"),
            _num(engine.get("accept_length"), ".2f"),
            *(_num(pos[j], ".3f") if j < len(pos) else "-" for j in range(positions)),
            _num(engine.get("tokens_per_target_forward"), ".2f"),
            _num(r.get("draft_loss"), ".4f"),
            _num(r.get("refit_s"), ".3f"),
            _num(r.get("step_time_s"), ".2f"),
        )
    return table


def instances_table(rows: list[dict]) -> Table | None:
    """The newest RL step's per-instance figures (its "instances" list); None when the rows have none."""
    rl = [r for r in grpo_rows(rows) if isinstance(r.get("instances"), list) and r["instances"]]
    if not rl:
        return None
    last = rl[-1]
    version = last.get("policy_version")
    title = f"rollout instances at step {last['step'] + 1}"
    if _number(version):
        title += f" (policy version {version})"
    table = Table(title=title)
    table.add_column("instance", justify="right")
    for name in INSTANCE_FIELDS:
        table.add_column(name.replace("_", " "), justify="right")
    fmts = {"accept_length": ".2f", "refit_s": ".3f", "busy_s": ".2f", "idle_s": ".2f"}
    for item in last["instances"]:
        if not isinstance(item, dict):
            continue
        cells = [
            _num(item.get(name), ",d" if isinstance(item.get(name), int) else fmts.get(name, ".4g"))
            for name in INSTANCE_FIELDS
        ]
        table.add_row(safe(str(item.get("instance", "-")), one_line=True)[:12], *cells)
    return table


def warmup_line(rows: list[dict]) -> str | None:
    """One line on the supervised warm-up (phase sft): its steps and last target loss."""
    sft = [r for r in rows if r.get("phase") == "sft"]
    if not sft:
        return None
    last = sft[-1].get("target_loss")
    return f"SFT warm-up: {len(sft)} step(s), last target loss {_num(last, '.4f')}"
