"""The model section from a Hugging Face config.json: tiny configs written by transformers' own config classes
(`save_pretrained`, config only) fill every model field; a layout value that disagrees, an unsupported architecture
and a missing or broken config.json are refused (exit 2 through `validate`); a path-only layout plans and renders;
a plan.json (render PLAN) recompiles without the folder and is refused when the folder's config.json changed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.spec.load import load_layout, load_layout_text
from specdraft.spec.schema import RopeScaling

transformers = pytest.importorskip("transformers")

LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SHAPE = dict(num_hidden_layers=8, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)


def _layout(folder: Path, extra: str = "") -> str:
    return f"""
name: hf-tiny
model:
  path: {folder}
  seq_length: 64
{extra}
cluster: {{num_nodes: 1, gpus_per_node: 1, gpu: cpu}}
training: {{dtype: fp32, distributed_optimizer: false, recompute: none, global_batch_size: 1}}
"""


def _save(config, folder: Path) -> Path:
    config.save_pretrained(folder)
    return folder


@pytest.fixture
def llama(tmp_path):
    config = transformers.LlamaConfig(
        **SHAPE,
        intermediate_size=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=LLAMA31_ROPE,
        tie_word_embeddings=False,
    )
    return _save(config, tmp_path / "llama")


def _model(folder: Path, extra: str = ""):
    return compile(load_layout_text(_layout(folder, extra))).model


def test_llama31_fills_every_field(llama):
    m = _model(llama)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads) == (8, 64, 128, 4)
    assert (m.num_query_groups, m.head_dim, m.vocab_size, m.max_position_embeddings) == (2, 16, 256, 131072)
    assert (m.normalization, m.norm_epsilon, m.rotary_base, m.qk_layernorm) == ("RMSNorm", 1e-5, 500000, False)
    assert m.rope_scaling == RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    assert (m.tie_embeddings, m.add_bias_linear, m.add_qkv_bias, m.swiglu) == (False, False, False, True)
    assert (m.attention_dropout, m.num_experts, m.moe_ffn_hidden_size) == (0.0, None, None)
    raw = (llama / "config.json").read_bytes()
    assert m.config_sha256 == hashlib.sha256(raw).hexdigest()
    assert "num_layers" in m.config_fields and "rope_scaling" in m.config_fields and "seq_length" not in m.config_fields


def test_qwen3_has_qk_norm_its_own_head_dim_and_tied_embeddings(tmp_path):
    config = transformers.Qwen3Config(
        **SHAPE,
        intermediate_size=192,
        head_dim=32,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    m = _model(_save(config, tmp_path / "qwen3"))
    assert (m.head_dim, m.qk_layernorm, m.norm_epsilon, m.rotary_base) == (32, True, 1e-6, 1000000)
    assert (m.tie_embeddings, m.rope_scaling, m.max_position_embeddings, m.ffn_hidden_size) == (True, None, 40960, 192)


def test_mixtral_fills_the_moe_fields(tmp_path):
    config = transformers.MixtralConfig(
        **SHAPE, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02
    )
    m = _model(_save(config, tmp_path / "mixtral"))
    assert (m.num_experts, m.moe_router_topk, m.moe_aux_loss_coeff) == (4, 2, 0.02)
    assert (m.moe_ffn_hidden_size, m.ffn_hidden_size, m.rotary_base, m.norm_epsilon) == (96, 96, 1000000, 1e-5)
    assert m.qk_layernorm is False


def test_qwen3_moe_fills_the_moe_fields(tmp_path):
    config = transformers.Qwen3MoeConfig(
        **SHAPE,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        rope_theta=1000000.0,
    )
    m = _model(_save(config, tmp_path / "qwen3moe"))
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.ffn_hidden_size) == (8, 2, 32, 128)
    assert (m.qk_layernorm, m.moe_aux_loss_coeff) == (True, 0.001)


def test_a_hub_config_with_rope_theta_and_rope_scaling_reads_the_same(tmp_path, llama):
    # Published checkpoints (e.g. meta-llama/Llama-3.1-8B) write rope_theta and rope_scaling, not rope_parameters.
    hub = json.loads((llama / "config.json").read_text())
    hub.pop("rope_parameters")
    hub.update(architectures=["LlamaForCausalLM"], rope_theta=500000.0, rope_scaling=LLAMA31_ROPE)
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hub))
    ours, theirs = _model(folder), _model(llama)
    assert (ours.rotary_base, ours.rope_scaling) == (theirs.rotary_base, theirs.rope_scaling)


def test_layout_values_that_agree_stand_and_one_that_disagrees_is_named(llama):
    agreeing = "  num_layers: 8\n  num_query_groups: 2\n  kv_channels: 16\n  rotary_base: 500000"
    assert _model(llama, agreeing).config_fields.count("num_layers") == 0
    with pytest.raises(SpecError) as info:
        load_layout_text(_layout(llama, "  num_layers: 6\n  norm_epsilon: 1.0e-6"))
    found = {p.path: p for p in info.value.problems}
    assert found["model.num_layers"].value == 6
    assert f"disagrees with {llama / 'config.json'}: its num_hidden_layers gives 8" in found["model.num_layers"].rule
    assert "its rms_norm_eps gives 1e-05" in found["model.norm_epsilon"].rule
    assert "drop model.num_layers" in found["model.num_layers"].fix


def test_the_cli_refuses_each_bad_checkpoint_with_exit_2(tmp_path, llama, specdraft_cli):
    gpt2 = transformers.GPT2Config(n_layer=2)
    gpt2.architectures = ["GPT2LMHeadModel"]
    _save(gpt2, tmp_path / "gpt2")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    cases = {
        "gpt2": "architectures ['GPT2LMHeadModel'] is not supported; specdraft builds LlamaForCausalLM, "
        "Qwen3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM",
        "empty": "is a folder without config.json, and the layout leaves model.num_layers, model.hidden_size,",
        "broken": "is not JSON",
    }
    for name, needle in cases.items():
        layout = tmp_path / f"{name}.yaml"
        layout.write_text(_layout(tmp_path / name))
        proc = specdraft_cli("validate", layout)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert "model.path" in proc.stderr and needle in " ".join(proc.stderr.split()), (name, proc.stderr)
        assert "Traceback" not in proc.stderr
    layout = tmp_path / "disagrees.yaml"
    layout.write_text(_layout(llama, "  vocab_size: 128"))
    proc = specdraft_cli("validate", layout)
    assert proc.returncode == 2 and "model.vocab_size" in proc.stderr and "vocab_size gives 256" in proc.stderr


def test_a_path_only_layout_validates_plans_and_renders(tmp_path, llama, specdraft_cli):
    layout = tmp_path / "path-only.yaml"
    layout.write_text(_layout(llama))
    assert specdraft_cli("validate", layout).returncode == 0
    proc = specdraft_cli("render", layout, "--to", "megatron")
    assert proc.returncode == 0, proc.stderr
    for flag in ("--num-layers 8", "--rotary-base 500000", "--use-rope-scaling", "--num-query-groups 2"):
        assert flag in " ".join(proc.stdout.split()), flag
    assert specdraft_cli("render", layout, "--to", "vllm").returncode == 0
    # NeMo-RL main cannot train its online draft with packing nor run async GRPO colocated: without both, it renders.
    nemo_rl = specdraft_cli("render", layout, "training.packing=false", "rollout.max_policy_lag=0", "--to", "nemo-rl")
    assert nemo_rl.returncode == 0 and "model_name: " + str(llama) in nemo_rl.stdout, nemo_rl.stderr
    assert specdraft_cli("plan", layout, "-o", tmp_path / "plan.json").returncode == 0


def test_plan_json_recompiles_without_the_folder_and_refuses_a_changed_config(tmp_path, llama, specdraft_cli):
    layout = tmp_path / "path-only.yaml"
    layout.write_text(_layout(llama))
    plan = tmp_path / "plan.json"
    assert specdraft_cli("plan", layout, "-o", plan).returncode == 0
    recorded = json.loads(plan.read_text())["model"]
    assert recorded["config_sha256"] == hashlib.sha256((llama / "config.json").read_bytes()).hexdigest()
    assert specdraft_cli("render", plan, "--to", "megatron").returncode == 0  # the folder is here and unchanged
    config = json.loads((llama / "config.json").read_text())
    shutil.move(llama, tmp_path / "elsewhere")  # a login node without the checkpoint: the recorded values stand
    assert specdraft_cli("render", plan, "--to", "megatron").returncode == 0
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 16}))
    proc = specdraft_cli("render", plan, "--to", "megatron")
    assert proc.returncode == 2 and "model.config_sha256" in proc.stderr and "recompile" in proc.stderr
    assert load_layout(layout).model.num_layers == 16  # the layout itself reads config.json afresh


@pytest.mark.parametrize(
    "config_class, kwargs, needle",
    [
        ("LlamaConfig", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ("LlamaConfig", {"attention_bias": True}, "not q/k/v/o without the MLP"),
        ("LlamaConfig", {"hidden_act": "gelu"}, "SwiGLU MLPs"),
        ("LlamaConfig", {"rope_theta": 10000.5}, "--rotary-base is an integer"),
        ("MixtralConfig", {"sliding_window": 4096}, "without a sliding window"),
        ("Qwen3MoeConfig", {"num_experts": 8, "norm_topk_prob": False}, "norm_topk_prob true"),
        ("Qwen3MoeConfig", {"num_experts": 8, "norm_topk_prob": True, "mlp_only_layers": [0]}, "every layer as MoE"),
    ],
)
def test_what_specdraft_cannot_build_is_refused_naming_the_key(tmp_path, config_class, kwargs, needle):
    config = getattr(transformers, config_class)(**SHAPE, intermediate_size=128, **kwargs)
    folder = _save(config, tmp_path / "ckpt")
    with pytest.raises(SpecError) as info:
        load_layout_text(_layout(folder))
    [problem] = info.value.problems
    assert problem.path == "model.path" and problem.value == str(folder / "config.json") and needle in problem.rule


def test_a_recorded_hash_that_no_longer_matches_is_refused(llama):
    with pytest.raises(SpecError) as info:
        load_layout_text(_layout(llama, f"  config_sha256: {'0' * 64}"))
    [problem] = info.value.problems
    assert problem.path == "model.config_sha256" and "config changed" in problem.rule


def test_a_folder_without_config_json_stands_beside_a_written_model_section(tmp_path):
    (tmp_path / "tokenizer").mkdir()  # tokenizer files only
    assert load_layout(None, [f"model.path={tmp_path / 'tokenizer'}"]).model.config_sha256 is None


def test_the_default_placeholder_path_is_never_read(tmp_path, monkeypatch):
    # A folder named like the old default path (`model`), holding a config.json, is not the model of a layout
    # that names none: the default is no path at all.
    _save(transformers.LlamaConfig(**SHAPE), tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    spec = load_layout(None)
    assert spec.model.path is None and spec.model.config_sha256 is None
