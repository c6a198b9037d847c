"""Tiny EAGLE-3 checkpoints in the three published layouts, written the way each project writes them (random
weights, safetensors), from one set of weights, so a test can import each and compare:

- vllm: vLLM's LlamaForCausalLMEagle3 as `specdraft export` writes it: `midlayer.*`, top-level
  `eagle_aux_hidden_state_layer_ids` in vLLM's numbering (layer inputs) and eagle_config's copy in SGLang's
  (outputs), norm_before_residual, d2t/t2d only for a reduced vocabulary (vLLM refuses d2t otherwise);
- specforge: SpecForge's configs/*-eagle3.json (no aux ids: SpecForge's default taps, or eagle_config's in layer
  outputs), max_position_embeddings 2048, `midlayer.*`, d2t and t2d always (its buffers), its own embed_tokens;
- speculators: Eagle3SpeculatorConfig (speculators_model_type eagle3, transformer_layer_config, ids in vLLM's
  numbering, norm_before_residual written), `layers.0.*`, embed_tokens, d2t and t2d.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

LAYER = ("input_layernorm", "hidden_norm", "post_attention_layernorm")
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def weights(
    *, hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int, vocab: int, draft_vocab: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """vLLM-named weights (fc blocks in ascending tap order), fp32, std 0.1; d2t/t2d for a reduced vocabulary."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    def norm(n):
        return torch.rand(n, generator=g) + 0.5

    q, kv = heads * head_dim, kv_heads * head_dim
    out = {"fc.weight": w(hidden, 3 * hidden), "norm.weight": norm(hidden), "lm_head.weight": w(draft_vocab, hidden)}
    out |= {f"midlayer.{n}.weight": norm(hidden) for n in LAYER}
    out |= {
        "midlayer.self_attn.q_proj.weight": w(q, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": w(kv, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": w(kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": w(hidden, q),
        "midlayer.mlp.gate_proj.weight": w(ffn, hidden),
        "midlayer.mlp.up_proj.weight": w(ffn, hidden),
        "midlayer.mlp.down_proj.weight": w(hidden, ffn),
    }
    if draft_vocab != vocab:
        kept = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
        out["d2t"] = kept - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[kept] = True
        out["t2d"] = t2d
    return out


def llama_fields(
    *, hidden, ffn, heads, kv_heads, head_dim, vocab, rope_theta=10000.0, eps=1e-5, max_positions=256
) -> dict:
    return {
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "rms_norm_eps": eps,
        "rope_theta": rope_theta,
        "max_position_embeddings": max_positions,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }


def write(
    fmt: str,
    folder: Path,
    tensors: dict[str, torch.Tensor],
    fields: dict,
    draft_vocab: int,
    aux_outputs: list[int] | None,
    norm_before_residual: bool = False,
    **extra,
) -> Path:
    """Write ``tensors`` (vLLM names) as a ``fmt`` checkpoint into ``folder``; ``aux_outputs`` in specdraft's
    numbering (layer outputs), None for no ids (the default taps); ``extra`` keys go into config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab = fields["vocab_size"]
    named = dict(tensors)
    inputs = None if aux_outputs is None else [a + 1 for a in sorted(aux_outputs)]
    if fmt == "vllm":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **fields}
        config |= {"draft_vocab_size": draft_vocab, "norm_before_residual": norm_before_residual}
        if inputs is not None:
            config["eagle_aux_hidden_state_layer_ids"] = inputs
            config["eagle_config"] = {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": aux_outputs}
    elif fmt == "specforge":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **fields}
        config |= {"draft_vocab_size": draft_vocab, "max_position_embeddings": 2048, "torch_dtype": "float32"}
        if aux_outputs is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_outputs}
        _identity_vocab(named, vocab, draft_vocab)
        named["embed_tokens.weight"] = torch.randn(vocab, fields["hidden_size"])
    elif fmt == "speculators":
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0",
            "transformer_layer_config": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **fields},
            "draft_vocab_size": draft_vocab,
            "norm_before_residual": norm_before_residual,
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
            "target_hidden_size": None,
            "eagle_aux_hidden_state_layer_ids": inputs,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "policy", "architectures": ["LlamaForCausalLM"]},
            },
        }
        _identity_vocab(named, vocab, draft_vocab)
        named = {k.replace("midlayer.", "layers.0."): v for k, v in named.items()}
        named["embed_tokens.weight"] = torch.randn(vocab, fields["hidden_size"])
    else:
        raise ValueError(fmt)
    config.update(extra)
    save_file({k: v.contiguous() for k, v in named.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _identity_vocab(named: dict, vocab: int, draft_vocab: int) -> None:
    """SpecForge and speculators save their d2t/t2d buffers even for the whole vocabulary."""
    if "d2t" not in named and draft_vocab == vocab:
        named["d2t"] = torch.zeros(vocab, dtype=torch.int64)
        named["t2d"] = torch.ones(vocab, dtype=torch.bool)
