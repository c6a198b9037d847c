"""What a new user brings to GRPO, made here (no hub): a tiny Llama-3-style checkpoint whose head_dim (32) vLLM's CPU
backend serves, a byte-level BPE tokenizer with Llama-3's chat template (eos = <|eot_id|>, the end of a turn), and a
file of GSM8K-style problems with their answers, in each of the row formats GRPO reads."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.support import hf_tokenizer

VOCAB = hf_tokenizer.VOCAB_SIZE
SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
MAX_POSITIONS = 128


def make_model(folder: Path, seed: int = 0) -> Path:
    """Tokenizer (saved by hf_tokenizer with eos <|eot_id|>) and a random-weight LlamaForCausalLM of SHAPE."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    hf_tokenizer.make_model_folder(folder)  # the tokenizer and its chat template (and a config we replace)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.eos_token = "<|eot_id|>"  # Llama-3-instruct's: generation ends with the turn
    tok.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
        **SHAPE,
    )
    torch.manual_seed(seed)
    for stale in folder.glob("model*.safetensors*"):
        stale.unlink()
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def problems(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs of one-digit sums: 'what is 3 + 4 ?' -> '7'."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append((f"what is {a} + {b} ?", str(a + b)))
    return out


def write_prompts(path: Path, n: int = 64, fmt: str = "problem_answer", seed: int = 0) -> Path:
    rows = []
    for question, answer in problems(n, seed):
        if fmt == "problem_answer":
            rows.append({"problem": question, "expected_answer": answer})
        elif fmt == "prompt_response":
            rows.append({"prompt": question, "response": answer})
        else:
            rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def overrides(model: Path, prompts: Path) -> list[str]:
    """grpo-tiny-cpu's overrides for the user's model and prompts (its shape is SHAPE's)."""
    return [
        f"model.path={model}",
        f"model.vocab_size={VOCAB}",
        "model.seq_length=64",
        f"model.max_position_embeddings={MAX_POSITIONS}",
        f"data.path={prompts}",
        "rollout.prompt_length=56",
        "grpo.reward=math-verify",
    ]
