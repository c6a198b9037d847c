"""Tiny Hugging Face checkpoints made with transformers' own config and model classes (random weights,
`save_pretrained` with safetensors; no hub), the spec overrides that describe them, and transformers' logits.

The weights are drawn wider than transformers' init (std 0.1, norms in [0.5, 1.5]) so that a wrong layout moves the
logits by far more than the parity tolerance. The vocabulary (257) divides by no tp > 1: the runtime pads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

VOCAB = 257
SEQUENCES = (20, 12)  # one packed row: two sequences, each a multiple of 4 (2*cp, and 2*tp under SP)
COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


# Each family's own settings on top of COMMON: Qwen3's RoPE base, epsilon and QK norm (its class's own), Llama-3.1's
# rope_scaling (at distances of a few dozen tokens it moves these logits by about 1e-2, far past the tolerance).
KIND = {
    "llama": {},
    "mixtral": {},
    "qwen3": dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    "llama31": dict(
        rope_theta=500_000.0,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}


def make(
    kind: str,
    folder: Path,
    seed: int = 0,
    max_shard_size: str | None = None,
    tokenizer: bool = False,
    dtype: torch.dtype = torch.float32,
    **changes,
) -> Path:
    """Write a tiny ``kind`` (llama, mixtral, qwen3) checkpoint into ``folder`` (sharded when ``max_shard_size`` is
    given, with a tiny BPE tokenizer when ``tokenizer``, stored in ``dtype``); returns it."""
    import transformers

    torch.manual_seed(seed)
    fields = {**COMMON, **KIND[kind], **changes}
    if kind in ("llama", "llama31"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    elif kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **fields))
    elif kind == "mixtral":
        config = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **fields)
        model = transformers.MixtralForCausalLM(config)
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    model.to(dtype).save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    if tokenizer:
        save_tokenizer(folder)
    return folder


def save_tokenizer(folder: Path) -> None:
    """A byte-level BPE of at most VOCAB tokens trained on generated text, saved as transformers saves one."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = ["policy", "draft", "token", "layer", "rank", "shard", "vocab", "sequence"]
    text = [" ".join(words[(i * j) % len(words)] for j in range(12)) for i in range(200)]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 1, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(text, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)


def overrides(folder: Optional[Path], kind: str = "llama") -> list[str]:
    """Spec overrides of the built-in layout that describe the checkpoint's shape (4 layers, so aux layers are given);
    the spec fills the rest (RoPE, epsilon, QK norm) from its config.json. folder None: the same shape from random
    weights (no model.path)."""
    c = COMMON
    out = [
        f"model.num_layers={c['num_hidden_layers']}",
        f"model.hidden_size={c['hidden_size']}",
        f"model.ffn_hidden_size={c['intermediate_size']}",
        f"model.num_attention_heads={c['num_attention_heads']}",
        f"model.num_query_groups={c['num_key_value_heads']}",
        f"model.vocab_size={VOCAB}",
        f"model.seq_length={sum(SEQUENCES)}",
        "draft.aux_layers=[0,1,2]",
    ]
    if folder is not None:
        out.append(f"model.path={folder}")
    if kind == "mixtral":
        out += [
            "model.num_experts=4",
            f"model.moe_ffn_hidden_size={c['intermediate_size']}",
            "model.moe_router_topk=2",
        ]
    return out


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (sum(SEQUENCES),), generator=torch.Generator().manual_seed(seed))


def reference_logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' fp32 logits of the packed row ``ids``, each sequence run on its own: (t, V)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    out, at = [], 0
    with torch.no_grad():
        for n in SEQUENCES:
            out.append(model(ids[None, at : at + n]).logits[0])
            at += n
    return torch.cat(out)


def row(ids: torch.Tensor):
    """The runtime's packed row for ``ids`` (the two SEQUENCES)."""
    from specdraft.runtime.train.data import Row

    cu = torch.tensor([0, SEQUENCES[0], sum(SEQUENCES)])
    positions = torch.cat([torch.arange(n) for n in SEQUENCES])
    return Row(tokens=ids, labels=ids, loss_mask=torch.ones(len(ids)), positions=positions, cu_seqlens=cu)
