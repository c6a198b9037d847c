"""Renders: Megatron argv, NeMo-RL overrides and vLLM settings for every shipped layout, against golden files."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.plan.codec import encode_value
from specdraft.render.megatron import format_argv, megatron_text
from specdraft.render.nemo_rl import render_text, to_dotlist
from specdraft.render.vllm import engine_settings
from specdraft.spec.load import load_layout
from tests.support.golden_util import check_golden
from tests.support.paths import SHIPPED

LAYOUTS = sorted((SHIPPED).glob("*.yaml"))
IDS = [p.stem for p in LAYOUTS]


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_megatron_argv_golden(layout):
    plan = compile(load_layout(layout))
    argv = plan.renders.megatron
    text = megatron_text(plan)  # what `render --to megatron` prints: what it does not carry, then the argv
    check_golden(f"megatron/{layout.stem}.txt", text)
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert comments[0].startswith(f"# Megatron-LM flags of layout {layout.stem}") and "the EAGLE-3 draft" in comments[0]
    assert text.endswith(format_argv(argv))
    assert tuple(shlex.split(format_argv(argv).replace("\\\n", " "))) == argv


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_nemo_rl_overrides_golden(layout):
    plan = compile(load_layout(layout))
    check_golden(f"nemo_rl/{layout.stem}.yaml", render_text(plan))


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_vllm_settings_golden(layout):
    plan = compile(load_layout(layout))
    assert plan.renders.vllm.problems == ()
    check_golden(f"vllm/{layout.stem}.json", json.dumps(encode_value(plan.renders.vllm), indent=2) + "\n")


def test_megatron_argv_carries_the_layout_and_leaves_the_draft_to_the_plan():
    plan = compile(
        load_layout(
            None,
            [
                "cluster.gpus_per_node=8",
                "parallel.tp=2",
                "parallel.sequence_parallel=true",
                "model.seq_length=64",
                "parallel.first_stage_layers=3",
                "parallel.last_stage_layers=5",
            ],
        )
    )
    argv = plan.renders.megatron
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--tensor-model-parallel-size"] == "2" and "--sequence-parallel" in argv
    assert pairs["--decoder-first-pipeline-num-layers"] == "3"
    assert pairs["--decoder-last-pipeline-num-layers"] == "5"
    # The draft's settings (stage, taps, CP attention) stay in plan.json: Megatron-LM would refuse them as flags.
    assert not [a for a in argv if a.startswith("--specdraft")]
    assert plan.draft.cp_attention == "zigzag_ring_branch_merge" and plan.taps[0].tap == "embedding"


def test_nemo_rl_keys_match_the_layout():
    plan = compile(load_layout(Path(LAYOUTS[0]).with_name("mixtral-8x22b.yaml")))
    cfg = plan.renders.nemo_rl
    meg = cfg["policy"]["megatron_cfg"]
    assert (
        meg["tensor_model_parallel_size"],
        meg["context_parallel_size"],
        meg["expert_model_parallel_size"],
        meg["pipeline_model_parallel_size"],
    ) == (4, 2, 8, 4)
    assert tuple(cfg["policy"]["draft"]["aux_layer_indices"]) == plan.draft.aux_layers
    assert cfg["cluster"] == {"gpus_per_node": 8, "num_nodes": 16}
    items = to_dotlist(cfg)
    assert "policy.megatron_cfg.context_parallel_size=2" in items
    assert "policy.megatron_cfg.num_layers_in_first_pipeline_stage=null" in items


def test_nemo_rl_passes_max_num_seqs_to_the_engine():
    # NeMo-RL's vllm_cfg has no max_num_seqs; its vLLM worker copies vllm_kwargs into the engine's arguments.
    spec = load_layout(Path(LAYOUTS[0]).with_name("qwen3-8b.yaml"), ["rollout.max_num_seqs=96"])
    items = to_dotlist(compile(spec).renders.nemo_rl)
    assert "policy.generation.vllm_kwargs.max_num_seqs=96" in items
    assert "policy.generation.vllm_kwargs.speculative_config.method=eagle3" in items


def test_vllm_schema_catches_bad_settings():
    spec = load_layout(Path(LAYOUTS[0]).with_name("qwen3-8b.yaml"), ["rollout.num_speculative_tokens=5"])
    settings = engine_settings(compile(spec))
    assert settings.speculative_config.num_speculative_tokens == 5
    assert settings.speculative_config.method == "eagle3"
    broken = settings.__class__(**{**settings.__dict__, "gpu_memory_utilization": 1.5, "tensor_parallel_size": 0})
    problems = broken.problems()
    assert any("gpu_memory_utilization" in p for p in problems)
    assert any("tensor_parallel_size" in p for p in problems)


def test_an_unset_path_renders_as_a_named_placeholder_no_engine_resolves():
    """model.path and draft.model left unset are written as placeholders that vLLM and NeMo-RL (through
    huggingface_hub's repo-id rule, which they apply to a name that is no local folder) refuse; the old default
    `checkpoints/draft` was a valid hub id, which an engine would have looked up on the hub."""
    hub = pytest.importorskip("huggingface_hub.utils")
    plan = compile(load_layout(None))
    engine = plan.renders.vllm.engine_args
    assert engine["model"] == "<model.path>" and engine["speculative_config"]["model"] == "<draft.model>"
    assert plan.renders.nemo_rl["policy"]["model_name"] == "<model.path>"
    speculative = plan.renders.nemo_rl["policy"]["generation"]["vllm_kwargs"]["speculative_config"]
    assert speculative["model"] == "<draft.model>"
    argv = plan.renders.megatron
    assert argv[argv.index("--tokenizer-model") + 1] == "<model.path>"
    for name in ("<model.path>", "<draft.model>"):
        with pytest.raises(hub.HFValidationError):
            hub.validate_repo_id(name)
    hub.validate_repo_id("checkpoints/draft")
    text = render_text(plan)
    assert "# PLACEHOLDERS: NeMo-RL and vLLM refuse these values until they are set:" in text
    given = compile(load_layout(None, ["model.path=/ckpt/policy", "draft.model=/ckpt/draft-eagle3"]))
    engine = given.renders.vllm.engine_args
    assert engine["model"] == "/ckpt/policy" and engine["speculative_config"]["model"] == "/ckpt/draft-eagle3"
    assert "PLACEHOLDERS" not in render_text(given)
    assert "placeholder" not in megatron_text(given)


def test_a_model_folder_without_a_tokenizer_leaves_the_tokenizer_flags_out_and_says_so():
    plan = compile(load_layout(None, ["model.path=/ckpt/config-only"]))
    text = megatron_text(plan, "model.path /ckpt/config-only holds no tokenizer files (tokenizer.json, ...)")
    assert "--tokenizer-model /ckpt/config-only" not in text and "--tokenizer-type HuggingFaceTokenizer \\" not in text
    comments = " ".join(line.removeprefix("# ") for line in text.splitlines() if line.startswith("# "))
    assert "Not carried: the tokenizer (model.path /ckpt/config-only holds no tokenizer files" in comments
    assert "--tokenizer-model /ckpt/config-only" in megatron_text(plan), "a hub id or a folder with one: carried"
