"""A tiny HF Llama policy (head_dim 32, which vLLM's CPU attention needs) and a random EAGLE-3 draft folder for it,
written as `specdraft export --policy` and `specdraft export` write theirs (config keys of serve/eagle3.config)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support import hf_models

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 128, 192, 4, 4, 2
AUX_INPUTS = (1, 2, 3)  # vLLM's ids: the inputs of layers 1..3 (specdraft's aux_layers [0, 1, 2])


def make_policy(folder: Path, seed: int = 0, **changes) -> Path:
    """A 4-layer Llama, hidden 128, 4 heads (head_dim 32), vocab 257, saved with save_pretrained."""
    fields = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS)
    return hf_models.make("llama", folder, seed=seed, **{**fields, **changes})


def draft_config(policy: Path, draft_vocab_size: int | None = None) -> dict:
    c = json.loads((Path(policy) / "config.json").read_text())
    vocab = c["vocab_size"]
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["hidden_size"] // c["num_attention_heads"],
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab_size or vocab,
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_theta": c.get("rope_theta", 10000.0),
        "max_position_embeddings": c["max_position_embeddings"],
        "target_hidden_size": c["hidden_size"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "norm_before_residual": False,
        "torch_dtype": "float32",
        "eagle_aux_hidden_state_layer_ids": list(AUX_INPUTS),
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [a - 1 for a in AUX_INPUTS]},
    }


def draft_tensors(config: dict, seed: int = 0, std: float = 0.1) -> dict[str, torch.Tensor]:
    """Random EAGLE-3 tensors of ``config``'s shapes (norm weights in [0.5, 1.5], as hf_models draws them)."""
    g = torch.Generator().manual_seed(seed)
    h, ffn, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {
        "fc.weight": (h, len(config["eagle_aux_hidden_state_layer_ids"]) * h),
        "midlayer.self_attn.q_proj.weight": (heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * d),
        "midlayer.mlp.gate_proj.weight": (ffn, h),
        "midlayer.mlp.up_proj.weight": (ffn, h),
        "midlayer.mlp.down_proj.weight": (h, ffn),
        "lm_head.weight": (config["draft_vocab_size"], h),
    }
    out = {name: torch.randn(shape, generator=g) * std for name, shape in shapes.items()}
    for name in ("midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"):
        out[f"{name}.weight"] = torch.rand(h, generator=g) + 0.5
    if config["draft_vocab_size"] != config["vocab_size"]:
        # every third target id, as a reduced vocabulary: draft id i is target id i + d2t[i]
        targets = torch.arange(config["draft_vocab_size"]) * 3 % config["vocab_size"]
        targets = targets.sort().values
        out["d2t"] = targets - torch.arange(config["draft_vocab_size"])
        out["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, targets, True)
    return out


def write_draft(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def make_draft(folder: Path, policy: Path, seed: int = 0, draft_vocab_size: int | None = None) -> Path:
    config = draft_config(policy, draft_vocab_size)
    return write_draft(folder, config, draft_tensors(config, seed))


def policy_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The HF folder's tensors by name (what refit_policy takes)."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def make_constant_policy(folder: Path, seed: int = 0) -> Path:
    """A policy whose final norm weight is zero: every logit is exactly 0, so greedy decoding (the first maximal
    index, in torch and in vLLM) emits token 0 forever, and sampling at temperature 1 is uniform."""
    make_policy(folder, seed=seed)
    tensors = policy_tensors(folder)
    tensors["model.norm.weight"] = torch.zeros_like(tensors["model.norm.weight"])
    from safetensors.torch import save_file

    for path in Path(folder).glob("*.safetensors"):
        path.unlink()
    save_file(tensors, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    return folder


def constant_draft(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A draft whose final norm weight is zero: it always proposes draft id 0 (target id 0 + d2t[0])."""
    tensors = draft_tensors(config, seed)
    tensors["norm.weight"] = torch.zeros_like(tensors["norm.weight"])
    return tensors
