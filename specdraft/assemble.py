"""The assembly step above plan/, render/ and rollout/: the whole compile, and reading a plan back from disk.

`compile(spec)` is the one public entry: validation (training and rollout rules) -> the core plan -> the renders
and the rollout plan. `read_plan` parses plan.json through `LaunchPlan.from_json` and then re-validates and
re-compiles its spec: a plan.json that differs from what this specdraft compiles from that spec is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specdraft.errors import Problem, SpecError, UserError
from specdraft.plan.codec import PlanFormatError, encode_value
from specdraft.plan.compile import check as check_training
from specdraft.plan.compile import compile_core
from specdraft.plan.model import LaunchPlan, PlanVersionError, Renders
from specdraft.render.megatron import megatron_argv
from specdraft.render.nemo_rl import nemo_rl_overrides
from specdraft.render.vllm import vllm_settings
from specdraft.rollout.model.instances import check_rollout, plan_rollout
from specdraft.rollout.model.speculation import with_adaptive_k
from specdraft.runs.files import parse_json
from specdraft.runs.paths import MAX_PLAN_BYTES
from specdraft.spec.schema import LayoutSpec


def check(spec: LayoutSpec) -> tuple[list[Problem], list[Problem]]:
    """Every error and warning of a layout: training field rules and memory, then the rollout rules."""
    errors, warnings = check_training(spec)
    r_errors, r_warnings = check_rollout(spec)
    return errors + r_errors, warnings + r_warnings


def compile(spec: LayoutSpec) -> LaunchPlan:
    """Validate and compile ``spec`` into the whole plan; raise SpecError listing every problem at once."""
    r_errors, r_warnings = check_rollout(spec)
    core = compile_core(spec, extra_errors=r_errors, extra_warnings=r_warnings)
    core = dataclasses.replace(core, rollout=with_adaptive_k(spec, plan_rollout(spec)))  # the vLLM render reads it
    renders = Renders(megatron=megatron_argv(core), nemo_rl=nemo_rl_overrides(core), vllm=vllm_settings(core))
    return dataclasses.replace(core, renders=renders)


def verify(plan: LaunchPlan, source: str) -> LaunchPlan:
    """The plan recompiled from its own spec; raise UserError naming the sections that differ from ``plan``."""
    try:
        fresh = compile(plan.spec)
    except SpecError as err:
        raise SpecError(err.problems, f"the spec inside {source}") from None
    if fresh.to_json() != plan.to_json():
        differ = [
            f.name
            for f in dataclasses.fields(LaunchPlan)
            if encode_value(getattr(fresh, f.name)) != encode_value(getattr(plan, f.name))
        ]
        raise UserError(
            f"{source} does not match what specdraft {fresh.specdraft_version} compiles from the spec "
            f"inside it (sections that differ: {', '.join(differ[:8])})",
            "it was edited by hand or written by another specdraft version; recompile it from the "
            "layout with `specdraft plan LAYOUT -o plan.json` (or launch the layout itself)",
        )
    return plan


def parse_plan(text: str | bytes, source: str) -> LaunchPlan:
    """plan.json text -> LaunchPlan, refusing JSON no plan holds, another schema_version or a malformed plan by
    name."""
    return plan_from_data(parse_json(text, source, "recompile it with `specdraft plan`"), source)


def plan_from_data(data: object, source: str) -> LaunchPlan:
    """plan.json's parsed JSON -> LaunchPlan, refusing another schema_version or a malformed plan by name."""
    try:
        return LaunchPlan.from_dict(data)
    except PlanVersionError as err:
        raise UserError(
            f"{source}: {err}",
            "recompile it with this specdraft: `specdraft plan LAYOUT -o plan.json`, or launch the layout itself",
        ) from None
    except (PlanFormatError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else err
        raise UserError(f"{source} is not a specdraft plan: {why}", "recompile it with `specdraft plan`") from None


def read_plan(path: str | Path) -> LaunchPlan:
    """Read, parse and verify plan.json at ``path`` (a regular file of bounded size), and, where its checkpoint
    folder is on this machine, that the checkpoint's config.json is still the one the plan was compiled from."""
    from specdraft.fsutil import read_regular_text
    from specdraft.spec.checkpoints.hf_config import check_recorded

    text = read_regular_text(Path(path), MAX_PLAN_BYTES, "plan file")
    plan = verify(parse_plan(text, str(path)), str(path))
    check_recorded(plan.spec.model, str(path))
    return plan
