"""The NeMo-RL render as text: a YAML config that inherits the profile's base config, headed by what the profile
refuses and what it does not carry; and the same overrides as Hydra dotlist items."""

from __future__ import annotations

from pathlib import PurePosixPath

from specdraft.plan.model import LaunchPlan
from specdraft.render.nemo_rl.profile import BASE_CONFIG, COMMIT, NAME, NOT_READ, RUN_SCRIPT, SOURCE
from specdraft.render.nemo_rl.rules import not_carried, refusals
from specdraft.render.paths import placeholder_notes


def render_text(plan: LaunchPlan) -> str:
    """The whole render: comments (profile, command, refusals, fields not carried), then `defaults:` naming the
    base config and the overrides. Saved next to the base config, NeMo-RL's load_config merges the two."""
    lines = [
        f"# NeMo-RL overrides of layout {plan.name} for profile {NAME} ({SOURCE} at {COMMIT[:12]}).",
        f"# Save as examples/configs/{plan.name}.yaml in NeMo-RL, then:",
        f"#   uv run python {RUN_SCRIPT} --config examples/configs/{plan.name}.yaml",
    ]
    refused = refusals(plan)
    if refused:
        lines.append(
            f"# REFUSED: {NAME} cannot run this layout ({len(refused)} limit{'s' if len(refused) > 1 else ''}):"
        )
        lines += [f"#   {p.render()}" for p in refused]
    placeholders = placeholder_notes(plan, plan.draft.enabled and plan.rollout_settings.speculative)
    if placeholders:
        lines.append("# PLACEHOLDERS: NeMo-RL and vLLM refuse these values until they are set:")
        lines += [f"#   {note}" for note in placeholders]
    lines.append(f"# not carried (no NeMo-RL key in {NAME}):")
    lines += [f"#   {field}: {why}" for field, why in not_carried(plan)]
    lines.append("# left out (NeMo-RL does not read them):")
    lines += [f"#   {key}: {why}" for key, why in NOT_READ.items()]
    lines.append(f"defaults: {PurePosixPath(BASE_CONFIG).name}")
    return "\n".join(lines) + "\n" + to_yaml(plan.renders.nemo_rl if plan.renders else {})


def to_yaml(overrides: dict) -> str:
    """YAML text of the overrides (block style, keys in render order)."""
    import yaml

    return yaml.safe_dump(overrides, sort_keys=False, default_flow_style=False)


def to_dotlist(overrides: dict, prefix: str = "") -> list[str]:
    """The same overrides as Hydra dotlist items (`policy.megatron_cfg.context_parallel_size=4`); on NeMo-RL's
    command line prefix each with ++ (add or override), since some keys are not in the base config."""
    items: list[str] = []
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            items += to_dotlist(value, f"{path}.")
        else:
            items.append(f"{path}={_scalar(value)}")
    return items


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}"
    return str(value)
