"""Model and draft folder files for the hostile-input tests: good config.json, draft config, safetensors header and
shard index contents that fit the built-in layout, and a safetensors header rewritten in place (its data kept)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

# A Llama config.json the built-in layout (tiny-cpu) validates with as its model.path.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 8,
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}  # fmt: skip
# A vLLM-format EAGLE-3 config.json the built-in layout validates with as its draft.path.
DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "draft_vocab_size": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "norm_before_residual": False,
    "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
    "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
}
# Two tensors tiling 56 data bytes, as safetensors writes them.
HEADER = {
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "I64", "shape": [4], "data_offsets": [24, 56]},
}
INDEX = {"metadata": {"total_size": 112}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}


def write_safetensors(path: Path, header: bytes | str, data: bytes = bytes(56)) -> Path:
    """A safetensors file of ``header`` (JSON text, written as it is) and ``data``."""
    raw = header.encode() if isinstance(header, str) else header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def read_header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def rewrite_header(path: Path, change) -> None:
    """``path``'s header changed by ``change(header)``, the data bytes kept as they are."""
    header, data = read_header(path)
    change(header)
    text = json.dumps(header).encode()
    write_safetensors(path, text + b" " * (-len(text) % 8), data)  # safetensors pads its header to 8 bytes
