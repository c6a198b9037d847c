"""An independent EAGLE-3 reader for the export tests: plain torch in float64, written from the loaders that consume
the format (vLLM `model_executor/models/llama_eagle3.py`, SpecForge `modeling/draft/llama3_eagle.py`), not from
specdraft's runtime. It rebuilds the draft from config.json + model.safetensors and runs the training-time test.

What it takes from those sources:
- fc over the aux hidden states concatenated in ascending layer order; ids from `eagle_config` name layer outputs
  (SGLang adds 1 itself), the top-level `eagle_aux_hidden_state_layer_ids` name layer inputs (vLLM);
- midlayer: input_layernorm on the token embedding, hidden_norm on the hidden state, attention over their
  concatenation (embedding first), residual = the un-normalised hidden state (norm_before_residual false),
  post_attention_layernorm, SwiGLU MLP, residual; Llama RMSNorm; rotate-half RoPE with rope_theta;
- TTT attention (SpecForge's cache_hidden path): step j's query sees step 0's keys causally and the keys of
  steps 1..j at its own position only, one softmax; positions are offset by j;
- the final `norm`, `lm_head` over the draft vocabulary, and vLLM's compute_logits: draft id i is target id
  i + d2t[i], every other target id gets -inf;
- the hidden state step j+1 reads: step j's output, after the final norm when config.json says `norm_output`
  (EAGLE-3.1; vLLM's LlamaModel returns it as the proposer's next hidden state).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch


class Eagle3Reader:
    def __init__(self, folder: Path):
        from safetensors.torch import load_file

        self.config = json.loads((Path(folder) / "config.json").read_text())
        self.weights = {
            k: (v.double() if v.is_floating_point() else v)
            for k, v in load_file(str(Path(folder) / "model.safetensors")).items()
        }
        c = self.config
        self.eps, self.theta = c["rms_norm_eps"], c["rope_theta"]
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.layer_outputs = list(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        self.norm_output = c.get("norm_output", False) is True  # vLLM's getattr default

    def w(self, name: str) -> torch.Tensor:
        return self.weights[name]

    def _rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w(name)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # x (L, h, d)
        d = x.shape[-1]
        inv = 1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        scaling = self.config.get("rope_scaling")
        if scaling:  # transformers' rope_type llama3, per frequency
            low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
            factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
            out = []
            for f in inv.tolist():
                wavelen = 2 * math.pi / f
                if wavelen < original / high:
                    out.append(f)
                elif wavelen > original / low:
                    out.append(f / factor)
                else:
                    smooth = (original / wavelen - low) / (high - low)
                    out.append((1 - smooth) * f / factor + smooth * f)
            inv = torch.tensor(out, dtype=torch.float64)
        freqs = positions.double()[:, None] * inv[None]
        emb = torch.cat([freqs, freqs], -1)[:, None, :]
        rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * emb.cos() + rotated * emb.sin()

    def ttt(self, hidden_by_layer: dict[int, torch.Tensor], emb: torch.Tensor) -> list[torch.Tensor]:
        """hidden_by_layer: target layer output id -> (L, Ht); emb: (S, L, H) token embeddings of each step.
        Returns S tensors (L, V): logits over the target vocabulary (-inf outside the draft's)."""
        fused = torch.cat([hidden_by_layer[i].double() for i in sorted(self.layer_outputs)], -1)
        hidden = fused @ self.w("fc.weight").T  # (L, H)
        length = hidden.shape[0]
        keys, values, out = [], [], []
        for j in range(emb.shape[0]):
            x = torch.cat(
                [
                    self._rms(emb[j].double(), "midlayer.input_layernorm.weight"),
                    self._rms(hidden, "midlayer.hidden_norm.weight"),
                ],
                -1,
            )  # (L, 2H)
            positions = torch.arange(length) + j
            q = (x @ self.w("midlayer.self_attn.q_proj.weight").T).view(length, self.heads, self.head_dim)
            k = (x @ self.w("midlayer.self_attn.k_proj.weight").T).view(length, self.kv_heads, self.head_dim)
            v = (x @ self.w("midlayer.self_attn.v_proj.weight").T).view(length, self.kv_heads, self.head_dim)
            q, k = self._rope(q, positions), self._rope(k, positions)
            rep = self.heads // self.kv_heads
            keys.append(k.repeat_interleave(rep, dim=1))
            values.append(v.repeat_interleave(rep, dim=1))
            scale = 1.0 / math.sqrt(self.head_dim)
            trunk = torch.einsum("lhd,mhd->hlm", q, keys[0]) * scale
            trunk = trunk.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
            diag = [torch.einsum("lhd,lhd->hl", q, kk)[..., None] * scale for kk in keys[1:]]  # (h, L, 1) each
            probs = torch.cat([trunk, *diag], -1).softmax(-1)
            attn = torch.einsum("hlm,mhd->lhd", probs[..., :length], values[0])
            for i, vv in enumerate(values[1:]):
                attn = attn + probs[..., length + i].T[..., None] * vv
            hidden_mid = hidden + attn.reshape(length, -1) @ self.w("midlayer.self_attn.o_proj.weight").T
            y = self._rms(hidden_mid, "midlayer.post_attention_layernorm.weight")
            gate = y @ self.w("midlayer.mlp.gate_proj.weight").T
            up = y @ self.w("midlayer.mlp.up_proj.weight").T
            hidden = hidden_mid + (torch.nn.functional.silu(gate) * up) @ self.w("midlayer.mlp.down_proj.weight").T
            normed = self._rms(hidden, "norm.weight")
            out.append(self.target_logits(normed @ self.w("lm_head.weight").T))
            if self.norm_output:  # EAGLE-3.1: vLLM's model returns the post-norm state as the next step's input
                hidden = normed
        return out

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """(L, Vd) -> (L, V) as vLLM's compute_logits places them (-inf where the draft has no token)."""
        vocab, draft_vocab = self.config["vocab_size"], self.config["draft_vocab_size"]
        if "d2t" not in self.weights:
            return draft_logits
        targets = torch.arange(draft_vocab) + self.w("d2t")
        full = draft_logits.new_full((draft_logits.shape[0], vocab), float("-inf"))
        full[:, targets] = draft_logits
        return full


# vLLM's Eagle3LlamaForCausalLM.load_weights and LlamaModel.load_weights renames, as the loader applies them.
STACKED = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)


def vllm_param_name(name: str) -> tuple[str | None, object]:
    """(vLLM parameter name or None when vLLM skips it, shard id or None) of one checkpoint tensor name."""
    if "t2d" in name:
        return None, None
    if "d2t" in name:
        return name.replace("d2t", "draft_id_to_target_id"), None
    if "lm_head" not in name:
        name = "model." + name
    name = name.replace("midlayer.", "layers.0.")
    for fused, part, shard in STACKED:
        if part in name:
            return name.replace(part, fused), shard
    return name, None


def vllm_param_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The parameters vLLM's Eagle3LlamaForCausalLM (one layer, aux states on) builds, at TP 1, and their shapes;
    model.embed_tokens is left out: vLLM shares the target's when the checkpoint has none."""
    h, i = config["hidden_size"], config["intermediate_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // nh
    target_h = config.get("target_hidden_size", h)
    layer = "model.layers.0."
    return {
        "model.fc.weight": (h, 3 * target_h),
        layer + "self_attn.qkv_proj.weight": ((nh + 2 * nkv) * d, 2 * h),
        layer + "self_attn.o_proj.weight": (h, nh * d),
        layer + "mlp.gate_up_proj.weight": (2 * i, h),
        layer + "mlp.down_proj.weight": (h, i),
        layer + "input_layernorm.weight": (h,),
        layer + "hidden_norm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        "model.norm.weight": (h,),
        "lm_head.weight": (config["draft_vocab_size"], h),
        "draft_id_to_target_id": (config["draft_vocab_size"],),
    }
