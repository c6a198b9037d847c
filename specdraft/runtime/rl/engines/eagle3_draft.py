"""An EAGLE-3 draft rebuilt in plain torch from the folder `specdraft export` writes (config.json +
model.safetensors), with the checkpoint's own parameter names, so a refit loads EAGLE-3 tensors by name. It offers
what serve/speculative.draft_chain drives (fc, layers[i].project/finish, head); the math is models/draft.py's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.plan.model import RopeScaling
from specdraft.runtime.models.draft import RMSNorm, rope


class _Attention(nn.Module):
    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class _Mlp(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)


class MidLayer(nn.Module):
    """EAGLE-3's one decoder layer (models/draft.DraftLayer with first=True): attention over
    [input_layernorm(emb) ; hidden_norm(hidden)], the un-normalised hidden state as the residual, SwiGLU MLP."""

    def __init__(self, config: dict):
        super().__init__()
        h, eps = config["hidden_size"], config["rms_norm_eps"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or h // self.heads
        self.rope_base = float(config.get("rope_theta", 10000.0))
        scaling = config.get("rope_scaling")
        self.rope_scaling = (
            RopeScaling(
                factor=scaling["factor"],
                low_freq_factor=scaling["low_freq_factor"],
                high_freq_factor=scaling["high_freq_factor"],
                original_max_position_embeddings=scaling["original_max_position_embeddings"],
            )
            if scaling
            else None
        )
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.self_attn = _Attention(2 * h, h, self.heads, self.kv_heads, self.head_dim)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = _Mlp(h, config["intermediate_size"])

    def project(self, hidden: torch.Tensor, emb: torch.Tensor | None, positions: torch.Tensor):
        """hidden, emb: (t, h), positions (t,) -> q (t, H, d), k, v (t, Hkv, d)."""
        assert emb is not None, "the EAGLE-3 midlayer always reads the token embedding"
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # (t, 2h)
        t = x.shape[0]
        base, scaling = self.rope_base, self.rope_scaling
        q = rope(self.self_attn.q_proj(x).view(t, self.heads, self.head_dim), positions, base, scaling)
        k = rope(self.self_attn.k_proj(x).view(t, self.kv_heads, self.head_dim), positions, base, scaling)
        v = self.self_attn.v_proj(x).view(t, self.kv_heads, self.head_dim)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """attn (t, H, d) -> (t, h): o_proj plus the residual, then the SwiGLU MLP plus the residual."""
        out = hidden + self.self_attn.o_proj(attn.flatten(1))
        x = self.post_attention_layernorm(out)
        return out + self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))


class FolderDraft(nn.Module):
    """fc, midlayer, norm, lm_head (+ d2t/t2d for a reduced vocabulary): the EAGLE-3 checkpoint's tensors."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, config: dict):
        super().__init__()
        h = config["hidden_size"]
        self.config = config
        self.aux_ids = [int(i) for i in config["eagle_aux_hidden_state_layer_ids"]]  # vLLM's: layer inputs
        self.vocab_size = int(config["vocab_size"])
        self.draft_vocab_size = int(config.get("draft_vocab_size") or self.vocab_size)
        self.fc = nn.Linear(len(self.aux_ids) * config.get("target_hidden_size", h), h, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(h, config["rms_norm_eps"])
        self.lm_head = nn.Linear(h, self.draft_vocab_size, bias=False)
        if self.draft_vocab_size != self.vocab_size:
            self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(self.vocab_size, dtype=torch.bool))

    @property
    def layers(self) -> list[MidLayer]:
        return [self.midlayer]

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, h) -> (rows, Vd) logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def carry(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the next draft step reads of a step's output: after the final norm under norm_output (EAGLE-3.1)."""
        return self.norm(hidden) if self.config.get("norm_output", False) else hidden

    def target_ids(self) -> torch.Tensor | None:
        """(Vd,) the target id of each draft id, or None when the vocabularies are the same."""
        if self.draft_vocab_size == self.vocab_size:
            return None
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def load(self, weights, strict: bool) -> None:
        """Copy EAGLE-3-named tensors in; unknown names are refused, and with ``strict`` so are missing ones."""
        load_named(self, weights, strict)


def load_named(module: nn.Module, weights, strict: bool) -> int:
    """Copy (name, tensor) pairs into ``module``'s parameters and buffers of those names (shape-checked);
    returns how many. An unknown name, a shape mismatch or (``strict``) a missing name raises ValueError."""
    own: dict[str, torch.Tensor] = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    seen = set()
    with torch.no_grad():
        for name, value in weights:
            if name not in own:
                raise ValueError(f"weight {name!r} has no place in the {type(module).__name__}")
            if tuple(own[name].shape) != tuple(value.shape):
                raise ValueError(f"weight {name!r}: shape {tuple(value.shape)}, expected {tuple(own[name].shape)}")
            own[name].copy_(value.to(own[name].device, own[name].dtype))
            seen.add(name)
    missing = sorted(set(own) - seen)
    if strict and missing:
        raise ValueError(f"the checkpoint lacks {', '.join(missing)}")
    return len(seen)


def load_folder(folder: Path, device: str) -> FolderDraft:
    """The draft of an EAGLE-3 folder, float32, on ``device``; placeholder weights when the folder holds only its
    config.json (a rollout instance's start: the first draft refit loads the real ones)."""
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / "config.json").read_text())
    draft = FolderDraft(config)
    weights = Path(folder) / "model.safetensors"
    if weights.is_file():
        draft.load(load_file(str(weights)).items(), strict=True)
    return draft.to(device).eval()
