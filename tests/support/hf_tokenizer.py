"""A real tokenizer for the data tests: a tiny byte-level BPE trained with `tokenizers` on generated text, wrapped as
a transformers PreTrainedTokenizerFast with a chat template and saved with save_pretrained (plus a tiny LlamaConfig)
into a Hugging Face model folder that AutoTokenizer loads. Conversations and data files to go with it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

VOCAB_SIZE = 320  # 256 bytes + the special tokens + merges; the layouts' model.vocab_size in these tests
WORDS = (
    "the a cat dog runs jumps over under red blue green quick slow model data train loss token chat hello world "
    "why how what is are can you tell me about please thanks sure here answer question"
).split()
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|pad|>")
SPECIALS += ("<|im_start|>", "<|im_end|>")

# Llama-3's shape: a header per message, the content, <|eot_id|>; the assistant's content and <|eot_id|> inside
# {% generation %}, so transformers' return_assistant_tokens_mask marks them.
LLAMA3 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|eot_id|>' }}{%- endgeneration %}"
    "{%- else %}{{- message['content'] + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA3_PLAIN = LLAMA3.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")  # same text, no markers
# ChatML's shape (Qwen's), without generation markers: the loss mask comes from rendering the prefixes.
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A template that rewrites earlier turns (as reasoning templates drop old thoughts): not prefix-stable.
REWRITING = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and not loop.last %}{{- '<|im_start|>assistant\\n...<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def sentence(rng: random.Random, low: int = 2, high: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def conversations(n: int, seed: int = 0, max_turns: int = 2) -> list[list[dict]]:
    """``n`` short chats: an optional system message, then user/assistant turns."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chat = [{"role": "system", "content": sentence(rng)}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, max_turns)):
            chat += [{"role": "user", "content": sentence(rng)}, {"role": "assistant", "content": sentence(rng)}]
        out.append(chat)
    return out


def make_model_folder(folder: Path, template: str | None = LLAMA3) -> Path:
    """Train the BPE (seeded text, so the same vocabulary every time) and save tokenizer + config to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    rng = random.Random(1234)
    text = [sentence(rng, 3, 12) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|pad|>",
        chat_template=template,
    )
    assert len(fast) == VOCAB_SIZE, len(fast)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=bos,
        eos_token_id=tok.token_to_id("<|end_of_text|>"),
    )
    # A whole checkpoint (random weights): a folder with config.json is imported, and must hold its weights.
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
