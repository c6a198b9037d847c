"""The EAGLE-3 checkpoint vLLM and SGLang load (vLLM `llama_eagle3.py`, SpecForge `llama3_eagle.py`): config.json
plus one model.safetensors, written from the draft's whole (unsharded) state dict into a folder that appears at once.

Aux layer ids, two conventions: specdraft (like SpecForge, modelopt, NeMo-RL) names a tapped layer by its *output*
(0-indexed); vLLM's top-level `eagle_aux_hidden_state_layer_ids` names the layer whose *input* it captures (id j is
the residual stream entering layer j = the output of layer j-1), so the top-level ids are ours + 1. SGLang reads
`eagle_config.eagle_aux_hidden_state_layer_ids` as outputs and adds the 1 itself, so that copy carries ours as is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdraft.plan.model import LaunchPlan
from specdraft.runtime.folders import ExportError, save_safetensors, write_folder, write_text
from specdraft.runtime.models.hf.export import check_pair, policy_config, policy_max_positions
from specdraft.runtime.serve.offline import require_one_layer

FORMAT_VERSION = 1
ARCHITECTURE = "LlamaForCausalLMEagle3"
# runtime name (Eagle3Draft.state_dict(), layer 0) -> EAGLE-3 checkpoint name
LAYER_NAMES = {
    "input_layernorm.weight": "midlayer.input_layernorm.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    "post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    **{f"{p}_proj.weight": f"midlayer.self_attn.{p}_proj.weight" for p in ("q", "k", "v", "o")},
    **{f"{p}_proj.weight": f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
}
TOP_NAMES = {
    "fc.weight": "fc.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "vocab.d2t": "d2t",
    "vocab.t2d": "t2d",
}


def vllm_aux_ids(aux_layers) -> list[int]:
    """specdraft's output-convention layer ids -> vLLM's input-convention ids (ascending, as vLLM captures)."""
    return [a + 1 for a in sorted(aux_layers)]


def tensors(state: dict[str, torch.Tensor], plan: LaunchPlan) -> dict[str, torch.Tensor]:
    """The EAGLE-3 tensors from the draft's whole state dict (runtime names). fc's input blocks are put in ascending
    layer order, the order in which vLLM and SGLang concatenate the captured states."""
    require_one_layer(plan)
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if name.endswith("._extra_state"):  # megatron's per-layer extra state (fp8 metadata): no weight
            continue
        if name.startswith("layers.0."):
            key = LAYER_NAMES.get(name[len("layers.0.") :])
        else:
            key = TOP_NAMES.get(name)
        if key is None:
            raise ExportError(f"draft tensor {name!r} has no EAGLE-3 name", "this is a bug in specdraft; report it")
        out[key] = value.detach().cpu().contiguous()
    # The head's rows past the draft vocabulary pad it to a tp multiple (a live draft gathered at tp > 1).
    out["lm_head.weight"] = out["lm_head.weight"][: plan.draft.vocab_size].contiguous()
    aux = list(plan.draft.aux_layers)
    order = sorted(range(len(aux)), key=aux.__getitem__)
    if order != list(range(len(aux))):
        blocks = out["fc.weight"].chunk(len(aux), dim=1)  # (H, n*Ht) -> n blocks (H, Ht), one per tap
        out["fc.weight"] = torch.cat([blocks[i] for i in order], dim=1).contiguous()
    return out


def config(plan: LaunchPlan, dtype: torch.dtype) -> dict:
    """config.json: a Llama config with the EAGLE-3 fields vLLM and SGLang read."""
    from specdraft.runtime.models.draft import draft_shape

    m, shape = plan.model, draft_shape(plan, tp=1)
    aux = sorted(plan.draft.aux_layers)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_query_groups,
        "head_dim": m.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": m.vocab_size,
        "draft_vocab_size": plan.draft.vocab_size,
        "rms_norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_base,
        # the policy's: vLLM serves the two as a pair (a draft limited to a shorter context loses acceptance past it)
        "max_position_embeddings": policy_max_positions(plan),
        "target_hidden_size": m.hidden_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        # False: layer 0's residual is the un-normalised hidden state (vLLM's default); an imported draft's own
        "norm_before_residual": plan.draft.norm_before_residual,
        # True: a draft step after the first reads the previous one's post-norm hidden state (EAGLE-3.1)
        "norm_output": plan.draft.norm_output,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_aux_hidden_state_layer_ids": vllm_aux_ids(aux),  # vLLM: the inputs of these layers
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": aux},  # SGLang: outputs
        **({"rope_scaling": rope_scaling(shape.rope_scaling)} if shape.rope_scaling is not None else {}),
    }


def rope_scaling(scaling) -> dict:
    """The draft's (the target's) Llama-3.1 RoPE scaling as transformers and vLLM read it from config.json."""
    return {
        "rope_type": "llama3",
        "factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_max_position_embeddings,
    }


def write(folder: Path, plan: LaunchPlan, state: dict[str, torch.Tensor], provenance: dict) -> Path:
    """Write config.json, model.safetensors and the provenance marker into ``folder``, which appears whole
    (folder.write_folder); an earlier specdraft export there is replaced, anything else refused. Refuses a draft
    whose config does not pair with the run's policy export (hf.export.check_pair)."""
    named = tensors(state, plan)
    dtype = named["fc.weight"].dtype
    draft_config = config(plan, dtype)
    check_pair(policy_config(plan), draft_config)

    def fill(tmp: Path) -> None:
        save_safetensors(named, tmp / "model.safetensors")
        write_text(tmp / "config.json", json.dumps(draft_config, indent=2) + "\n")

    record = {
        "format_version": FORMAT_VERSION,
        "architecture": ARCHITECTURE,
        "run": plan.run_name,
        "spec_sha256": plan.spec_sha256,
        "specdraft_version": plan.specdraft_version,
        "aux_layers_outputs": sorted(plan.draft.aux_layers),
        **provenance,
    }
    return write_folder(folder, fill, record)


def num_tensors(folder: Path) -> int:
    """How many tensors the export in ``folder`` holds (read from the safetensors header, no tensor loaded)."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as handle:
        return len(list(handle.keys()))
