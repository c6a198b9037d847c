"""The layout's grpo section: its rules (counts, clips, the reward's form, the digit tasks' vocabulary, vLLM's CPU
head_dim), the resolved plan section, its NeMo-RL keys, and the shipped grpo-tiny-cpu layout."""

from __future__ import annotations

import pytest

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.plan.grpo import NEMO_RL_KEYS, nemo_rl_overrides
from specdraft.spec.load import load_layout
from specdraft.spec.validate import validate_fields
from tests.support.paths import SHIPPED

GRPO = SHIPPED / "grpo-tiny-cpu.yaml"


def _problems(layout, *overrides) -> tuple[list[str], list[str]]:
    errors, warnings = validate_fields(load_layout(layout, list(overrides)))
    return [f"{p.path}: {p.rule}" for p in errors], [f"{p.path}: {p.rule}" for p in warnings]


def test_the_shipped_layout_compiles_with_its_grpo_section():
    plan = compile(load_layout(GRPO, []))
    g = plan.grpo
    assert (g.num_prompts_per_step, g.num_generations_per_prompt, g.task, g.engine) == (8, 4, "markov", "builtin")
    assert plan.model.head_dim == 32 and plan.draft.refit_interval == 1
    assert _problems(GRPO, "grpo.engine=vllm") == ([], [])  # 4 ranks: the engine has its own process and world


def test_every_bad_grpo_value_is_reported_at_once():
    errors, _ = _problems(
        GRPO,
        "rollout.num_generations_per_prompt=1",
        "grpo.temperature=-1",
        "grpo.ratio_clip_min=1.0",
        "grpo.reference_policy_kl_penalty=-0.1",
        "grpo.reward=not a function",
        "grpo.reward_timeout_s=0",
        "draft.refit_interval=0",
    )
    assert [e.split(":")[0] for e in errors] == [
        "rollout.num_generations_per_prompt",
        "grpo.temperature",
        "grpo.reward_timeout_s",
        "grpo.ratio_clip_min",
        "grpo.reference_policy_kl_penalty",
        "grpo.reward",
        "draft.refit_interval",
    ]
    assert _problems(GRPO, "grpo.reward=my.rewards:score", "grpo.reward=math-verify", "grpo.task=arithmetic") == (
        [],
        [],
    )
    errors, _ = _problems(GRPO, "grpo.reward=math-verify")
    assert errors == [
        "grpo.reward: math-verify compares a response with the prompt's answer; the markov task's prompts have none"
    ]


def test_digit_tasks_need_their_ids_and_vllm_on_cpu_needs_head_dim_32():
    errors, _ = _problems(None, "model.vocab_size=12", "grpo.task=reverse")
    assert any(e.startswith("grpo.task: the digit tasks need model.vocab_size >= 16") for e in errors)
    _, warnings = _problems(None, "grpo.engine=vllm", "cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1")
    assert warnings == ["grpo.engine: vLLM on CPU serves head_dim >= 32 only; this model's is 16"]


def test_the_nemo_rl_overrides_name_nemo_rl_keys():
    plan = compile(load_layout(GRPO, ["grpo.ratio_clip_max=0.28", "grpo.reference_policy_kl_penalty=0.01"]))
    out = nemo_rl_overrides(plan.grpo, train_iters=plan.training.train_iters)
    assert out["loss_fn.ratio_clip_max"] == 0.28 and out["loss_fn.reference_policy_kl_penalty"] == 0.01
    assert out["grpo.num_generations_per_prompt"] == 4 and out["grpo.max_num_steps"] == 30
    assert out["loss_fn.token_level_loss"] is True
    assert set(NEMO_RL_KEYS) < set(out)


def test_a_frozen_draft_needs_a_draft_and_a_warm_up():
    assert _problems(GRPO, "grpo.draft_mode=frozen") == ([], [])
    assert compile(load_layout(GRPO, ["grpo.draft_mode=frozen"])).grpo.draft_mode == "frozen"
    assert compile(load_layout(GRPO, [])).grpo.draft_mode == "cotrain"
    errors, _ = _problems(GRPO, "grpo.draft_mode=frozen", "draft.enabled=false", "grpo.sft_steps=0")
    assert [e.split(":")[0] for e in errors] == ["grpo.draft_mode", "grpo.draft_mode"]
    assert "draft.enabled" in errors[0] and "sft_steps" in errors[1]
    errors, _ = _problems(GRPO, "grpo.draft_mode=frozen", "training.warmup_steps=4")  # sft_steps 4
    assert [e.split(":")[0] for e in errors] == ["grpo.draft_mode"] and "never train" in errors[0]
    with pytest.raises(SpecError, match="grpo.draft_mode"):
        load_layout(GRPO, ["grpo.draft_mode=never"])


def test_a_grpo_layout_plans_its_instances_and_its_schedule():
    plan = compile(load_layout(GRPO, []))
    assert plan.rollout is not None and plan.rollout.num_instances == 4 and plan.rollout.tp == 1
    assert [i.training_ranks for i in plan.rollout.instances] == [(0,), (1,), (2,), (3,)]
    assert plan.rollout_settings.schedule == "fifo"
    assert compile(load_layout(GRPO, ["rollout.schedule=asp"])).rollout_settings.schedule == "asp"
    assert compile(load_layout(None, [])).rollout is None  # a cotrain layout plans none unless rollout.enabled


def test_a_prompt_file_needs_rewards_that_read_text(tmp_path):
    model, prompts = tmp_path / "model", tmp_path / "prompts.jsonl"
    model.mkdir()
    file = [f"data.path={prompts}", f"model.path={model}"]
    errors, _ = _problems(GRPO, *file)
    assert "grpo.reward: `task` scores a built-in task's answers, but data.path gives the prompts" in errors
    errors, _ = _problems(GRPO, *file, "grpo.reward=math-verify", "data.format=text")
    assert [e.split(":")[0] for e in errors] == ["data.format"]
    assert _problems(GRPO, *file, "grpo.reward=math-verify") == ([], [])


def test_a_built_in_task_refuses_a_model_with_a_tokenizer_of_its_own(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    errors, _ = _problems(GRPO, f"model.path={tmp_path}")
    want = "data.path: the built-in grpo.task 'markov' writes its prompts in token ids"
    assert any(e.startswith(want) for e in errors)


def test_the_engines_max_model_len_fits_the_policys_positions():
    errors, _ = _problems(GRPO, "rollout.prompt_length=40")
    assert any(e.startswith("rollout.prompt_length: the engines' max_model_len") for e in errors), errors


def test_grpo_refuses_rollout_it_cannot_run_naming_the_fields():
    errors, warnings = _problems(GRPO, "rollout.tp=2")  # grpo.engine: builtin: on its lead's device, and said so
    assert errors == [] and warnings == [
        "grpo.engine: the built-in engine serves an instance on its lead's device alone: at rollout.tp 2, 1 of each "
        "instance's devices idle while it generates (rollout.tp sets how many instances there are)"
    ]
    assert _problems(GRPO, "rollout.tp=2", "grpo.engine=vllm") == ([], [])
    errors, _ = _problems(GRPO, "rollout.colocated=false", "rollout.num_nodes=1", "rollout.enabled=true")
    assert [e.split(":")[0] for e in errors] == ["rollout.colocated"] and "dedicated rollout nodes" in errors[0]
    # a co-training layout's rollout section only plans: the same settings pass there
    assert _problems(GRPO, "workload=cotrain", "rollout.tp=2", "rollout.colocated=false", "rollout.num_nodes=1") == (
        [],
        [],
    )
