"""The policy as a HF checkpoint transformers and vLLM load: the unsharded GPTModel's tensors mapped back to HF
names and layouts (mapping.source at tp = 1, inverted), sharded safetensors with model.safetensors.index.json,
config.json (the input checkpoint's own when model.path names one, else made from the plan's model) and the
input's tokenizer files. Also the pair rule between a run's policy and draft exports, which vLLM serves together.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specdraft.plan.model import LaunchPlan
from specdraft.runtime.folders import ExportError
from specdraft.runtime.models.hf import mapping
from specdraft.runtime.models.hf.checkpoint import (
    FAMILIES,
    INDEX,
    SINGLE,
    architecture,
    folder_of,
    geometry,
    read_config,
    read_tensors,
    stored_dtype,
    tokenizer_files,
)

MAX_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size ("5GB")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
TRAINING_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def policy_architecture(plan: LaunchPlan) -> str:
    """The input checkpoint's architecture, else the family that the plan's model is."""
    folder = folder_of(plan.model.path)
    if folder is not None:
        return architecture(read_config(folder), folder)
    if plan.model.num_experts:
        return "MixtralForCausalLM"
    return "Qwen3ForCausalLM" if plan.model.qk_layernorm else "LlamaForCausalLM"


def export_dtype(plan: LaunchPlan) -> torch.dtype:
    """The input checkpoint's dtype (so an import and export round trip is exact), else the run's."""
    folder = folder_of(plan.model.path)
    if folder is not None:
        stored = stored_dtype(read_tensors(folder))
        if stored in SAFETENSORS_DTYPES:
            return SAFETENSORS_DTYPES[stored]
    return TRAINING_DTYPES[plan.training.dtype]


def policy_config(plan: LaunchPlan, dtype: torch.dtype | None = None) -> dict:
    """config.json of the policy export: the input's own (transformers reads it as it did), else one made from the
    plan's model in the family's terms."""
    folder = folder_of(plan.model.path)
    if folder is not None:
        config = dict(read_config(folder))
    else:
        config = _made_config(plan)
    if dtype is not None:
        config["torch_dtype"] = DTYPE_NAMES[dtype]
        if "dtype" in config:  # transformers 5 writes `dtype`; older readers read `torch_dtype`
            config["dtype"] = DTYPE_NAMES[dtype]
    return config


def policy_max_positions(plan: LaunchPlan) -> int:
    """The policy's max_position_embeddings, which the draft export must carry too."""
    return int(policy_config(plan)["max_position_embeddings"])


def _made_config(plan: LaunchPlan) -> dict:
    m = plan.model
    arch = policy_architecture(plan)
    config = {
        "architectures": [arch],
        "model_type": FAMILIES[arch].model_types[0],
        "hidden_size": m.hidden_size,
        "intermediate_size": m.moe_ffn_hidden_size if m.num_experts else m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_query_groups,
        "head_dim": m.head_dim,
        "num_hidden_layers": m.num_layers,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        # megatron's defaults where the plan does not say (what the runtime builds): eps 1e-5, RoPE base 10000
        "rms_norm_eps": m.norm_epsilon,
        "rope_theta": float(m.rotary_base),
        "tie_word_embeddings": m.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
    }
    scaling = m.rope_scaling
    if scaling is not None:
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    if arch == "LlamaForCausalLM":
        config["mlp_bias"] = False
    if m.num_experts:
        config.update(
            num_local_experts=m.num_experts,
            num_experts_per_tok=m.moe_router_topk,
            router_aux_loss_coef=m.moe_aux_loss_coeff,
            sliding_window=None,
        )
    return config


def hf_tensors_of(plan: LaunchPlan, state: dict[str, torch.Tensor], dtype: torch.dtype):
    """(HF name, tensor) of the whole policy, one HF tensor at a time, from the unsharded GPTModel ``state``
    (tp = ep = 1): every HF tensor must be covered exactly once, or ExportError."""
    g = geometry(plan.model, FAMILIES[policy_architecture(plan)])
    wanted = mapping.hf_tensors(g)
    parts: dict[str, list[tuple[str, int, mapping.Piece]]] = {name: [] for name in wanted}
    for name in state:
        if name.endswith("._extra_state"):  # megatron's per-layer fp8 metadata: no weight
            continue
        try:
            source = mapping.source(name, g, mapping.Shard(), mapping.Shard())
        except mapping.UnmappedParameter:
            raise ExportError(
                f"the policy's parameter {name!r} has no Hugging Face name in a {g.family.name} checkpoint",
                "export a run whose model is one of the supported families (docs/models.md)",
            ) from None
        at = 0
        for piece in source.pieces:
            parts[piece.name].append((name, at, piece))
            at += mapping.piece_shape(piece, wanted[piece.name])[0]
    for hf_name, shape in wanted.items():
        out = torch.empty(shape, dtype=dtype)
        covered = 0
        for name, at, piece in parts[hf_name]:
            rows = mapping.piece_shape(piece, shape)[0]
            r0, r1 = piece.rows or (0, shape[0])
            block = state[name].narrow(0, at, rows)
            if piece.cols is None:
                out[r0:r1] = block
            else:
                out[r0:r1, piece.cols[0] : piece.cols[1]] = block
            covered += block.numel()
        if covered != out.numel():
            raise ExportError(
                f"HF tensor {hf_name!r} got {covered} of its {out.numel()} values from the policy",
                "this is a bug in specdraft's HF mapping; report it",
            )
        yield hf_name, out


def write(
    folder: Path,
    plan: LaunchPlan,
    state: dict[str, torch.Tensor],
    provenance: dict,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict:
    """Write the policy export into ``folder`` (appearing whole: runtime/folders.py), in safetensors shards of at
    most ``max_shard_bytes`` (a larger tensor gets a shard of its own); returns what was written."""
    from safetensors.torch import save_file

    from specdraft.runtime.folders import write_folder, write_text

    dtype = export_dtype(plan)
    config = policy_config(plan, dtype)
    source = folder_of(plan.model.path)
    written: dict = {"shards": 0, "tensors": 0, "bytes": 0}

    def fill(tmp: Path) -> None:
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        temp_names: list[tuple[str, list[str]]] = []
        for name, tensor in hf_tensors_of(plan, state, dtype):
            nbytes = tensor.numel() * tensor.element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                temp_names.append(_save(save_file, shards[-1], tmp, len(temp_names)))
                shards[-1], size = {}, 0
            shards[-1][name] = tensor
            size += nbytes
            written["tensors"] += 1
            written["bytes"] += nbytes
        temp_names.append(_save(save_file, shards[-1], tmp, len(temp_names)))
        weight_map = _name_shards(tmp, temp_names)
        if weight_map is not None:
            index = {"metadata": {"total_size": written["bytes"]}, "weight_map": weight_map}
            write_text(tmp / INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n")
        write_text(tmp / "config.json", json.dumps(config, indent=2) + "\n")
        for path in tokenizer_files(source) if source is not None else []:
            shutil.copyfile(path, tmp / path.name)
        written["shards"] = len(temp_names)

    record = {"format": "huggingface", "architecture": config["architectures"][0], "run": plan.run_name}
    write_folder(folder, fill, {**record, "spec_sha256": plan.spec_sha256, **provenance})
    return {**written, "architecture": config["architectures"][0], "dtype": DTYPE_NAMES[dtype]}


def _save(save_file, tensors: dict, tmp: Path, index: int) -> tuple[str, list[str]]:
    name = f".shard-{index:05d}.safetensors"
    save_file(tensors, str(tmp / name), metadata={"format": "pt"})
    return name, list(tensors)


def _name_shards(tmp: Path, shards: list[tuple[str, list[str]]]) -> dict[str, str] | None:
    """Rename the written shards to transformers' names; the weight map (None for a single model.safetensors)."""
    if len(shards) == 1:
        (tmp / shards[0][0]).rename(tmp / SINGLE)
        return None
    weight_map = {}
    for i, (name, tensors) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (tmp / name).rename(tmp / final)
        weight_map.update({t: final for t in tensors})
    return weight_map


def check_pair(policy: dict, draft: dict) -> None:
    """The policy's and the draft's config.json as vLLM serves them together: the same vocabulary,
    max_position_embeddings and hidden size, and aux-layer ids vLLM can capture from the policy's layers (it
    captures the *input* of layer i, for i in 1..num_hidden_layers-1; 0 would be the embedding). ExportError
    naming both values otherwise."""
    problems = []
    for key, other in (
        ("vocab_size", "vocab_size"),
        ("max_position_embeddings", "max_position_embeddings"),
        ("target_hidden_size", "hidden_size"),
    ):
        if key in draft and draft[key] != policy.get(other):
            problems.append(f"the draft's {key} is {draft[key]} but the policy's {other} is {policy.get(other)}")
    layers = int(policy.get("num_hidden_layers") or 0)
    ids = list(draft.get("eagle_aux_hidden_state_layer_ids", []))
    outside = [i for i in ids if not 1 <= i <= layers - 1]
    if outside:
        problems.append(
            f"the draft's eagle_aux_hidden_state_layer_ids {ids} (layer inputs) include {outside}, which the "
            f"policy's num_hidden_layers {layers} cannot give (vLLM captures inputs of layers 1..{layers - 1})"
        )
    outputs = (draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if outputs is not None and [o + 1 for o in sorted(outputs)] != sorted(ids):
        problems.append(f"the draft's aux layer outputs {outputs} are not its inputs {ids} less one")
    if problems:
        raise ExportError(
            "the policy and draft exports of this run would not pair in vLLM: " + "; ".join(problems),
            "use draft.aux_layers below the last layer and a model section that matches the checkpoint's config.json",
        )
