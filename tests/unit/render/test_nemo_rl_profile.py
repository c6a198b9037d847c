"""The NeMo-RL render against its profile (nemo-rl-main-2026-08-22): every key it sets is one NeMo-RL reads, with
the type NeMo-RL reads; every shipped layout is accepted or refused with the limit named; fields are carried."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.render.nemo_rl import PROFILE, not_carried, refusals, render_text
from specdraft.render.nemo_rl.grpo import grpo_keys, merge
from specdraft.render.nemo_rl.profile import CARRIED, COMMIT, FROM_CHECKPOINT, NOT_CARRIED, NOT_READ, RULES
from specdraft.spec.load import load_layout
from specdraft.spec.schema import LayoutSpec
from tests.support.cli import run_cli
from tests.support.nemo_rl_keys import COMMIT as TABLE_COMMIT
from tests.support.nemo_rl_keys import KEYS, type_ok
from tests.support.paths import SHIPPED

LAYOUTS = sorted(SHIPPED.glob("*.yaml"))
QWEN = SHIPPED / "qwen3-8b.yaml"
RUNNABLE = ["training.packing=false", "rollout.colocated=false", "rollout.num_nodes=1"]  # qwen3-8b, accepted

# What the profile refuses in each shipped layout (the spec field each refusal names); an empty set is accepted.
REFUSED = {
    "grpo-tiny-cpu": set(),
    "llama3-70b": {"parallel.cp", "rollout.max_policy_lag"},
    "llama3.1-8b-pat": set(),
    "mixtral-8x22b": {"parallel.cp", "rollout.max_policy_lag"},
    "mixtral-tiny-cpu": {"parallel.cp", "rollout.max_policy_lag"},
    "one-gpu": {"training.packing", "rollout.max_policy_lag"},
    "qwen3-14b-pat": set(),
    "qwen3-8b-256k": {"parallel.cp", "rollout.max_policy_lag"},
    "qwen3-8b": {"training.packing", "rollout.max_policy_lag"},
    "tiny-cpu": {"parallel.cp", "rollout.max_policy_lag"},
}

# Layout variants that reach every branch of the render: fp8, vpp, dedicated rollout, hierarchical CP, no draft.
VARIANTS = {
    "qwen3-8b-runnable": (QWEN, RUNNABLE),
    "qwen3-8b-fp8-selective": (QWEN, [*RUNNABLE, "training.dtype=fp8", "training.recompute=selective"]),
    "mixtral-vpp-a2a": (
        SHIPPED / "mixtral-8x22b.yaml",
        ["draft.enabled=false", "parallel.cp_comm_type=a2a+p2p", "parallel.hierarchical_cp_sizes=[2,1]"],
    ),
    "tiny-split": (
        SHIPPED / "tiny-cpu.yaml",
        [
            "parallel.account_for_embedding_in_pipeline_split=true",
            "parallel.account_for_loss_in_pipeline_split=true",
            "draft.enabled=false",
        ],
    ),
}


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield path, value
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def _plan(layout: Path, overrides: list[str] | None = None):
    return compile(load_layout(layout, overrides or []))


def test_the_key_table_and_the_profile_name_one_commit():
    assert TABLE_COMMIT == COMMIT and PROFILE == "nemo-rl-main-2026-08-22"


@pytest.mark.parametrize(
    "layout,overrides",
    [(p, []) for p in LAYOUTS] + list(VARIANTS.values()),
    ids=[p.stem for p in LAYOUTS] + list(VARIANTS),
)
def test_every_rendered_key_is_a_nemo_rl_key_of_its_type(layout, overrides):
    rendered = _plan(layout, overrides).renders.nemo_rl
    for path, value in _leaves(rendered):
        if isinstance(value, dict) and value and path not in KEYS:
            continue  # a section: its leaves are checked
        assert path in KEYS, f"{path} is not a key NeMo-RL reads at {COMMIT[:12]}"
        assert type_ok(KEYS[path], value), f"{path} = {value!r} is not {KEYS[path]}"
    assert not any(path in NOT_READ for path, _ in _leaves(rendered))


@pytest.mark.parametrize("layout", LAYOUTS, ids=[p.stem for p in LAYOUTS])
def test_every_shipped_layout_is_accepted_or_refused_with_the_limit(layout):
    problems = refusals(_plan(layout))
    assert {p.path for p in problems} == REFUSED[layout.stem]
    for p in problems:
        assert PROFILE in p.rule and ".py" in p.rule  # the limit and the NeMo-RL file that enforces it
        assert "what would lift the limit" in p.fix


def test_the_refusals_name_the_limit_and_its_lift():
    (cp,) = [p for p in refusals(_plan(SHIPPED / "llama3-70b.yaml")) if p.path == "parallel.cp"]
    assert "Context Parallelism" in cp.rule and "PR 4059" in cp.fix
    (packing,) = [p for p in refusals(_plan(QWEN)) if p.path == "training.packing"]
    assert "does not support sequence packing yet" in packing.rule
    lag = refusals(_plan(QWEN, ["training.packing=false"]))
    assert [p.path for p in lag] == ["rollout.max_policy_lag"] and "Colocated async GRPO" in lag[0].rule
    no_draft = refusals(_plan(SHIPPED / "tiny-cpu.yaml", ["draft.enabled=false", "training.packing=false"]))
    assert {p.path for p in no_draft} == {"training.packing", "rollout.max_policy_lag"}
    assert set(RULES) == {"draft_packing", "draft_cp", "cp_packing", "async_colocated"}
    assert refusals(_plan(QWEN, RUNNABLE)) == []


def test_recompute_granularity_is_carried():
    meg = {
        g: _plan(QWEN, [f"training.recompute={g}"]).renders.nemo_rl["policy"]["megatron_cfg"]
        for g in ("none", "selective", "full")
    }
    assert meg["none"]["activation_checkpointing"] is False and "recompute_granularity" not in meg["none"]
    assert (meg["selective"]["recompute_granularity"], meg["selective"]["recompute_modules"]) == (
        "selective",
        ["core_attn"],
    )
    assert (meg["full"]["activation_checkpointing"], meg["full"]["recompute_granularity"]) == (True, "full")


def test_vpp_fp8_optimizer_grad_reduce_and_backend_are_carried():
    mixtral = _plan(SHIPPED / "mixtral-8x22b.yaml").renders.nemo_rl["policy"]
    assert mixtral["megatron_cfg"]["model_overrides"] == {
        "virtual_pipeline_model_parallel_size": 2,
        "cp_comm_type": "p2p",
    }
    assert mixtral["dtensor_cfg"] == {"enabled": False} and mixtral["make_sequence_length_divisible_by"] % 4 == 0
    cfg = _plan(
        QWEN,
        [
            *RUNNABLE,
            "training.dtype=fp8",
            "training.lr=2e-6",
            "training.clip_grad=0.5",
            "training.grad_reduce_in_bf16=true",
        ],
    ).renders.nemo_rl
    meg = cfg["policy"]["megatron_cfg"]
    assert meg["fp8_cfg"] == {"enabled": True, "fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param": True}
    assert (meg["optimizer"]["lr"], meg["optimizer"]["clip_grad"], cfg["policy"]["max_grad_norm"]) == (2e-6, 0.5, 0.5)
    assert meg["optimizer"]["bf16"] is True and meg["distributed_data_parallel_config"]["grad_reduce_in_fp32"] is False
    assert _plan(QWEN, ["training.dtype=fp32"]).renders.nemo_rl["policy"]["megatron_cfg"]["optimizer"]["bf16"] is False


def test_dedicated_rollout_nodes_and_async_grpo_are_carried():
    cfg = _plan(QWEN, RUNNABLE).renders.nemo_rl
    assert cfg["policy"]["generation"]["colocated"] == {
        "enabled": False,
        "resources": {"gpus_per_node": 8, "num_nodes": 1},
    }
    assert cfg["cluster"] == {"gpus_per_node": 8, "num_nodes": 2}  # NeMo-RL's cluster is training + generation nodes
    assert cfg["grpo"]["async_grpo"] == {
        "enabled": True,
        "max_trajectory_age_steps": 1,
        "in_flight_weight_updates": False,
    }
    lag2 = _plan(QWEN, [*RUNNABLE, "rollout.max_policy_lag=2"]).renders.nemo_rl["grpo"]["async_grpo"]
    assert lag2["max_trajectory_age_steps"] == 2 and lag2["in_flight_weight_updates"] is True
    assert cfg["loss_fn"]["use_importance_sampling_correction"] is True
    assert cfg["policy"]["sequence_packing"] == {"enabled": False}
    assert cfg["policy"]["draft"]["model_name"] is None  # a model_name would override num_layers and the taps
    sync = _plan(QWEN, ["rollout.max_policy_lag=0"]).renders.nemo_rl
    assert sync["grpo"]["async_grpo"]["enabled"] is False
    assert "use_importance_sampling_correction" not in sync["loss_fn"]


def test_fields_without_a_key_are_listed_as_not_carried():
    plan = _plan(QWEN, RUNNABLE)
    text = render_text(plan)
    fields = [f for f, _ in not_carried(plan)]
    assert {"draft.stage", "draft.lr", "training.tp_comm_overlap", "slurm.*"} <= set(fields)
    assert all(f"#   {f}: " in text for f in fields) and "REFUSED" not in text
    assert "defaults: grpo_math_8B_megatron.yaml\npolicy:\n" in text and "examples/run_grpo.py --config" in text
    assert "model.moe_aux_loss_coeff" in [f for f, _ in not_carried(_plan(SHIPPED / "mixtral-8x22b.yaml"))]


def test_grpo_keys_map_plain_values():
    assert grpo_keys(num_prompts_per_step=32, num_generations_per_prompt=16) == {
        "grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 16}
    }
    out = grpo_keys(
        num_prompts_per_step=8,
        num_generations_per_prompt=4,
        ratio_clip_min=0.2,
        ratio_clip_max=0.28,
        reference_policy_kl_penalty=0.0,
    )
    assert out["loss_fn"] == {"ratio_clip_min": 0.2, "ratio_clip_max": 0.28, "reference_policy_kl_penalty": 0.0}
    assert all(f"loss_fn.{k}" in KEYS for k in out["loss_fn"]) and all(f"grpo.{k}" in KEYS for k in out["grpo"])
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4}) == {"a": {"b": 1, "c": 3}, "d": 4}


def test_render_refuses_and_validate_warns():
    refused = run_cli("render", QWEN, "--to", "nemo-rl")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "does not support sequence packing yet" in refused.stderr and "PR 3463" in refused.stderr
    valid = run_cli("validate", QWEN)
    assert valid.returncode == 0 and "Colocated async GRPO" in valid.stdout and "2 warnings" in valid.stdout
    accepted = run_cli("render", QWEN, *RUNNABLE, "--to", "nemo-rl")
    assert accepted.returncode == 0 and "colocated:\n      enabled: false" in accepted.stdout


def _spec_fields() -> list[str]:
    out = []
    for section in dataclasses.fields(LayoutSpec):
        kind = LayoutSpec.__dataclass_fields__[section.name].default_factory  # a section's dataclass, or MISSING
        if section.name == "model":
            out += [f"model.{f.name}" for f in dataclasses.fields(load_layout(QWEN).model)]
        elif dataclasses.is_dataclass(kind):
            out += [f"{section.name}.{f.name}" for f in dataclasses.fields(kind)]
        else:
            out.append(section.name)
    return out


def test_every_spec_field_is_carried_or_listed_as_not_carried():
    listed = set(CARRIED) | set(NOT_CARRIED)
    wildcards = {f.removesuffix("*") for f in listed | {FROM_CHECKPOINT} if f.endswith("*")}
    missing = [f for f in _spec_fields() if f not in listed and not any(f.startswith(w) for w in wildcards)]
    assert not missing, (
        f"map these spec fields to a NeMo-RL key (profile.CARRIED) or list them as not carried: {missing}"
    )
    assert not set(CARRIED) & set(NOT_CARRIED)
    assert all(key in KEYS for f, key in CARRIED.items() if f != "name")


def test_the_shipped_grpo_layout_is_accepted_with_its_grpo_keys_and_under_cp_refused():
    under_cp = _plan(SHIPPED / "grpo-tiny-cpu.yaml", ["parallel.cp=2", "training.packing=true"])
    assert {r.path for r in refusals(under_cp)} == {"parallel.cp"}
    plan = _plan(SHIPPED / "grpo-tiny-cpu.yaml", [])
    assert refusals(plan) == []
    cfg = plan.renders.nemo_rl
    assert cfg["grpo"]["num_prompts_per_step"] == 8 and cfg["grpo"]["num_generations_per_prompt"] == 4
    assert cfg["policy"]["generation"]["max_new_tokens"] == 8
    assert cfg["loss_fn"]["ratio_clip_min"] == 0.2 and cfg["loss_fn"]["token_level_loss"] is True
