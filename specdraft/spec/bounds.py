"""Documented bounds of a layout: the largest inputs and values specdraft accepts, so every command does bounded work.

The loader applies the per-value bounds while it converts (the value is reported and the default stands in);
`validate_fields` applies every bound, the cross-field ones included, before any other rule, so `validate`, `plan`
and the rollout commands agree. docs/spec.md prints this module's table (spec.docs renders it).
"""

from __future__ import annotations

import math
import re
from dataclasses import fields, is_dataclass
from typing import Any

from specdraft.errors import Problem

# ---- input size ----------------------------------------------------------------------------------------------
MAX_LAYOUT_BYTES = 1 << 20  # a layout file, and all overrides of one command together
MAX_OVERRIDES = 1000  # KEY=VALUE overrides on one command
MAX_YAML_NODES = 200_000  # YAML nodes after alias expansion (OmegaConf's guard; its default of 10,000 is too tight)
MAX_OVERRIDE_YAML_NODES = 10_000  # an override value is parsed by OmegaConf's dotlist, which keeps its own default
MAX_LIST_ITEMS = 100_000  # items of a list field (training.sequence_lengths, ...)
MAX_STRING_CHARS = 4096  # characters of a string value (PATH_MAX)
MAX_INTERPOLATIONS = 64  # ${...} interpolations in one layout
MAX_INTERPOLATED_NODES = 20_000  # values of a layout that uses interpolations (resolving builds OmegaConf's nodes)

# ---- cluster and workload size -------------------------------------------------------------------------------
MAX_WORLD_SIZE = 131_072  # GPUs (ranks) of the training job, and rollout GPUs; cluster.num_nodes * gpus_per_node
MAX_SAMPLES_PER_STEP = 65_536  # rollout.num_prompts_per_step * num_generations_per_prompt
MAX_SEED = 2**32 - 1  # fits every RNG the runtime seeds (torch's Generator also gets seed * 1,000,003 + ...)
MAX_LENGTH = 1 << 24  # tokens: sequence, prompt and response lengths, vocabulary size

# ---- `specdraft rollout simulate` options --------------------------------------------------------------------
MAX_SEEDS = 1000  # --seeds
MAX_SIM_STEPS = 1000  # --steps
# --check-every: adaptive TP plans at every check-point, so the cost grows as 1/period (1 step cost ~50x the
# default 64); docs/rollout.md's sweep shows 16 and 256 give the same makespans, so nothing below 16 is worth it.
MIN_CHECK_EVERY = 16
MAX_CHECK_EVERY = 1 << 20
# --steps x samples per step: the simulator holds a seed's samples at once (~2 KB each, ~1 ms each to simulate).
MAX_SIMULATED_SAMPLES = 1 << 18

# Inclusive (lowest, highest) of each integer field; list items and mapping values share their field's entry.
# Lowest bounds with a rule of their own (e.g. parallel.tp >= 1) are left to that rule: only absurd magnitudes
# are cut here, so the rules that follow (divisors, memory sums) only ever see sane numbers.
FLOOR = -(2**31)
DEFAULT_INT_RANGE = (FLOOR, 2**31 - 1)
INT_RANGES: dict[str, tuple[int, int]] = {
    "model.num_layers": (FLOOR, 4096),
    "model.hidden_size": (FLOOR, 1 << 20),
    "model.ffn_hidden_size": (FLOOR, 1 << 22),
    "model.num_attention_heads": (FLOOR, 4096),
    "model.num_query_groups": (FLOOR, 4096),
    "model.kv_channels": (FLOOR, 1 << 16),
    "model.vocab_size": (FLOOR, MAX_LENGTH),
    "model.seq_length": (FLOOR, MAX_LENGTH),
    "model.num_experts": (FLOOR, 16_384),
    "model.moe_ffn_hidden_size": (FLOOR, 1 << 22),
    "model.moe_router_topk": (FLOOR, 16_384),
    "model.max_position_embeddings": (FLOOR, MAX_LENGTH),
    "model.rotary_base": (FLOOR, 10**12),
    "model.rope_scaling.original_max_position_embeddings": (FLOOR, MAX_LENGTH),
    "cluster.num_nodes": (FLOOR, MAX_WORLD_SIZE),
    "cluster.gpus_per_node": (FLOOR, 1024),
    "parallel.tp": (FLOOR, MAX_WORLD_SIZE),
    "parallel.cp": (FLOOR, MAX_WORLD_SIZE),
    "parallel.pp": (FLOOR, 4096),
    "parallel.dp": (FLOOR, MAX_WORLD_SIZE),
    "parallel.ep": (FLOOR, MAX_WORLD_SIZE),
    "parallel.etp": (FLOOR, MAX_WORLD_SIZE),
    "parallel.vpp": (FLOOR, 4096),
    "parallel.first_stage_layers": (FLOOR, 4096),
    "parallel.last_stage_layers": (FLOOR, 4096),
    "parallel.hierarchical_cp_sizes": (FLOOR, MAX_WORLD_SIZE),
    "draft.num_layers": (FLOOR, 64),
    "draft.aux_layers": (FLOOR, 4096),
    "draft.ttt_steps": (FLOOR, 64),
    "draft.stage": (FLOOR, 4096),
    "draft.vocab_size": (FLOOR, MAX_LENGTH),
    "draft.export_interval": (FLOOR, 10**9),
    "draft.refit_interval": (FLOOR, 10**9),
    "draft.lr_warmup_steps": (FLOOR, 10**9),
    "training.micro_batch_size": (FLOOR, 1 << 20),
    "training.global_batch_size": (FLOOR, 1 << 24),
    "training.sequence_lengths": (FLOOR, MAX_LENGTH),
    "training.train_iters": (FLOOR, 10**9),
    "training.warmup_steps": (FLOOR, 10**9),
    "training.seed": (0, MAX_SEED),
    "training.data_drift_interval": (FLOOR, 10**9),
    "data.seed": (0, MAX_SEED),
    "slurm.cpus_per_task": (FLOOR, 4096),
    "rollout.num_nodes": (FLOOR, MAX_WORLD_SIZE),
    "rollout.tp": (FLOOR, 1024),
    "rollout.num_prompts_per_step": (FLOOR, 16_384),
    "rollout.num_generations_per_prompt": (FLOOR, 1024),
    "rollout.prompt_length": (FLOOR, MAX_LENGTH),
    "rollout.max_response_length": (FLOOR, MAX_LENGTH),
    "rollout.max_policy_lag": (FLOOR, 1024),
    "rollout.num_speculative_tokens": (FLOOR, 64),
    "rollout.max_model_len": (FLOOR, 2 * MAX_LENGTH),
    "grpo.sft_steps": (FLOOR, 10**9),
}

# C0 and C1 control characters and DEL: a NUL truncates argv and C strings, a line break ends an #SBATCH line.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# slurm.env values are shell-quoted in `export` lines, where tabs and line breaks are carried intact.
CONTROL_IN_ENV_VALUE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Lone surrogates come from undecodable bytes in an argument (surrogateescape); they cannot be written as UTF-8.
SURROGATE = re.compile(r"[\ud800-\udfff]")
_INDEX = re.compile(r"\[\d+\]")


def field_key(path: str) -> str:
    """`training.sequence_lengths[3]` -> `training.sequence_lengths`; `slurm.env.FOO` -> `slurm.env`."""
    path = _INDEX.sub("", path)
    return "slurm.env" if path.startswith("slurm.env.") else path


def int_problem(path: str, value: int, shown: Any = None) -> Problem | None:
    lo, hi = INT_RANGES.get(field_key(path), DEFAULT_INT_RANGE)
    if lo <= value <= hi:
        return None
    shown = value if shown is None else shown
    if value > hi:
        return Problem(
            path=path,
            value=shown,
            rule=f"is larger than specdraft's bound of {hi:,}",
            fix="use a realistic value (docs/spec.md, 'Bounds', lists every bound)",
        )
    return Problem(
        path=path,
        value=shown,
        rule=f"is below specdraft's bound of {lo:,}",
        fix="use a value in range (docs/spec.md, 'Bounds')" if lo == FLOOR else f"use {lo}..{hi:,}",
    )


def float_problem(path: str, value: float) -> Problem | None:
    if math.isfinite(value):
        return None
    return Problem(
        path=path,
        value=value,
        rule="must be a finite number (not nan or inf)",
        fix=f"`specdraft explain {field_key(path)}` shows the default and what the field means",
    )


def string_problem(path: str, value: str) -> Problem | None:
    if len(value) > MAX_STRING_CHARS:
        return Problem(
            path=path,
            value=value,
            rule=f"is {len(value):,} characters; the bound is {MAX_STRING_CHARS:,}",
            fix="shorten it",
        )
    control = CONTROL_IN_ENV_VALUE if field_key(path) == "slurm.env" else CONTROL
    bad = control.search(value)
    if bad:
        return Problem(
            path=path,
            value=value,
            rule=f"contains the control character {bad.group()!r} at position {bad.start()}",
            fix="remove it (NUL, escape codes and line breaks cannot be carried safely into argv, scripts and logs)",
        )
    if SURROGATE.search(value):
        return Problem(
            path=path, value=value, rule="is not valid Unicode text (undecodable bytes)", fix="write it in UTF-8"
        )
    return None


def list_problem(path: str, value: list) -> Problem | None:
    if len(value) <= MAX_LIST_ITEMS:
        return None
    return Problem(
        path=path,
        value=value,
        rule=f"has {len(value):,} items; the bound is {MAX_LIST_ITEMS:,}",
        fix="list fewer (typical values suffice)",
    )


def value_problems(value: Any, path: str) -> list[Problem]:
    """Every per-value bound broken by ``value`` (a field's value, walked into lists and mappings)."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        found = int_problem(path, value)
    elif isinstance(value, float):
        found = float_problem(path, value)
    elif isinstance(value, str):
        found = string_problem(path, value)
    elif isinstance(value, list):
        found = list_problem(path, value)
        if found is None:
            return [p for i, item in enumerate(value) for p in value_problems(item, f"{path}[{i}]")]
    elif isinstance(value, dict):
        return [
            p
            for key, item in value.items()
            for p in (value_problems(str(key), f"{path}.<key>") + value_problems(item, f"{path}.{key}"))
        ]
    elif is_dataclass(value):
        return [p for f in fields(value) for p in value_problems(getattr(value, f.name), _join(path, f.name))]
    else:
        return []
    return [found] if found else []


def check(spec) -> list[Problem]:
    """Every bound a whole LayoutSpec breaks: per value (as the loader applies them) and across fields."""
    problems = value_problems(spec, "")
    if problems:
        return problems  # the products below are meaningless (and possibly huge) with a value out of bounds
    c, r = spec.cluster, spec.rollout
    world = c.num_nodes * c.gpus_per_node
    if world > MAX_WORLD_SIZE:
        problems.append(
            Problem(
                path="cluster",
                value=f"{c.num_nodes} nodes x {c.gpus_per_node} GPUs = {world:,}",
                rule=f"is more than specdraft's bound of {MAX_WORLD_SIZE:,} GPUs",
                fix="plan a smaller job (the bound keeps planning within seconds and a few GB)",
            )
        )
    if r.enabled and not r.colocated and r.num_nodes * c.gpus_per_node > MAX_WORLD_SIZE:
        problems.append(
            Problem(
                path="rollout.num_nodes",
                value=r.num_nodes,
                rule=f"{r.num_nodes} nodes x {c.gpus_per_node} GPUs is more than specdraft's bound "
                f"of {MAX_WORLD_SIZE:,} rollout GPUs",
                fix="plan fewer rollout nodes",
            )
        )
    samples = r.num_prompts_per_step * r.num_generations_per_prompt
    if samples > MAX_SAMPLES_PER_STEP:
        problems.append(
            Problem(
                path="rollout.num_prompts_per_step",
                value=r.num_prompts_per_step,
                rule=f"x num_generations_per_prompt ({r.num_generations_per_prompt}) = {samples:,} "
                f"samples per step; the bound is {MAX_SAMPLES_PER_STEP:,}",
                fix="simulate fewer prompts per step (the scheduler's figures scale with them)",
            )
        )
    return problems


def bounds_table() -> list[tuple[str, str]]:
    """(what, bound) rows for docs/spec.md."""
    rows = [
        ("layout file, and all overrides together", f"{MAX_LAYOUT_BYTES:,} bytes of UTF-8 text"),
        ("overrides on one command", f"{MAX_OVERRIDES:,}"),
        (
            "YAML nodes after expanding aliases",
            f"{MAX_YAML_NODES:,} in a file, {MAX_OVERRIDE_YAML_NODES:,} in one override value",
        ),
        ("items of a list field", f"{MAX_LIST_ITEMS:,}"),
        (
            "characters of a string value",
            f"{MAX_STRING_CHARS:,}, no control characters (slurm.env values may hold tabs and line breaks)",
        ),
        (
            "`${...}` interpolations",
            f"{MAX_INTERPOLATIONS}, each a whole or part of one value, pointing at a "
            f"single value; no resolvers; in a layout of at most {MAX_INTERPOLATED_NODES:,} "
            "values",
        ),
        ("GPUs: cluster.num_nodes x gpus_per_node, and rollout GPUs", f"{MAX_WORLD_SIZE:,}"),
        ("rollout samples per step: num_prompts_per_step x num_generations_per_prompt", f"{MAX_SAMPLES_PER_STEP:,}"),
        ("every float field", "finite (no nan, no inf)"),
        ("`rollout simulate --seeds` / `--steps`", f"1..{MAX_SEEDS:,} / 1..{MAX_SIM_STEPS:,}"),
        ("`rollout simulate --check-every` (decode steps)", f"{MIN_CHECK_EVERY}..{MAX_CHECK_EVERY:,}"),
        ("`rollout simulate`: --steps x samples per step", f"{MAX_SIMULATED_SAMPLES:,} simulated samples per seed"),
    ]
    for path, (lo, hi) in INT_RANGES.items():
        rows.append((f"`{path}`", f"{lo:,}..{hi:,}" if lo != FLOOR else f"at most {hi:,}"))
    rows.append(("any other integer field", f"{DEFAULT_INT_RANGE[0]:,}..{DEFAULT_INT_RANGE[1]:,}"))
    return rows


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
