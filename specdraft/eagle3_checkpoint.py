"""A published EAGLE-3 checkpoint's config.json in specdraft's terms, without torch: which of three layouts it is
(vLLM's LlamaForCausalLMEagle3, SpecForge's, speculators' Eagle3Speculator), its shape, and its aux layers in
specdraft's numbering. Shared by the CLI's spec check (spec/checkpoints/draft.py) and the ranks' import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional

from specdraft import jsonfile
from specdraft.errors import UserError
from specdraft.jsonfile import ListOf, Obj, Opt

CONFIG = "config.json"
MAX_CONFIG_BYTES = 1 << 20
ARCHITECTURE = "LlamaForCausalLMEagle3"  # vLLM's and SpecForge's (and what `specdraft export` writes)
SPECULATORS = "eagle3"  # speculators_model_type of speculators' Eagle3Speculator
# Llama's class defaults (transformers LlamaConfig) for the keys a config.json may leave out.
LLAMA_DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}
# How each convention numbers a tap (docs/models.md): vLLM and speculators count the layer whose *input* is
# captured (id j = the residual stream entering layer j = the output of layer j-1); SpecForge, SGLang's
# eagle_config, NeMo-RL and specdraft count the layer whose *output* it is. The same tensor is one apart.
INPUTS = "vLLM's numbering: the layer whose input is captured"
OUTPUTS = "SpecForge's numbering: the layer whose output is captured"
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# The keys whose type the reader relies on; the rest are checked value by value where they are read.
_LAYER = {"rope_scaling": Opt(Obj()), "rope_parameters": Opt(Obj()), "hidden_act": Opt(str), "model_type": Opt(str)}
SHAPE = Obj(
    {
        **_LAYER,
        "architectures": Opt(ListOf(str)),
        "eagle_config": Opt(Obj({AUX_KEY: Opt(ListOf(int))})),
        "transformer_layer_config": Opt(Obj(_LAYER)),
    }
)


class Finding(NamedTuple):
    """One thing wrong with a draft checkpoint for a layout: the spec field it is about, its value, the rule (with
    both values), the fix."""

    field: str
    value: Any
    rule: str
    fix: str


@dataclass(frozen=True)
class DraftConfig:
    """What a draft checkpoint's config.json says, in the names specdraft's draft uses."""

    file: str
    format: str  # vllm, specforge or speculators
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_layers: int
    vocab_size: int  # the target's vocabulary (t2d's length)
    draft_vocab_size: int
    aux_outputs: Optional[tuple[int, ...]]  # specdraft's numbering (layer outputs); None = EAGLE-3's default taps
    aux_said: str  # the key, its value and its numbering, for messages
    norm_before_residual: bool
    norm_output: bool  # EAGLE-3.1: a draft step after the first reads the previous one's post-norm hidden state
    max_position_embeddings: Optional[int]
    rope_theta: float
    rope_scaling: Optional[dict]  # llama3 scaling's four numbers, or None
    rms_norm_eps: float


@dataclass(frozen=True)
class Expected:
    """What the layout (or the plan) needs of its draft checkpoint."""

    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    draft_vocab_given: bool  # draft.vocab_size set (else the target's)
    num_layers: int  # draft.num_layers
    aux_layers: tuple[int, ...]  # resolved, specdraft's numbering
    default_aux: tuple[int, ...]  # EAGLE-3's default taps of this policy (what a checkpoint without ids means)
    rotary_base: float
    rope_scaling: Optional[dict]
    norm_epsilon: float
    norm_before_residual: bool
    norm_output: bool
    seq_length: int


def read(folder: Path) -> tuple[Optional[DraftConfig], list[Finding]]:
    """The config.json of the draft checkpoint ``folder``: (its DraftConfig, []) or (None, what is wrong)."""
    file = Path(folder) / CONFIG
    out: list[Finding] = []

    def bad(rule: str, fix: str) -> tuple[None, list[Finding]]:
        return None, [*out, Finding("draft.path", str(folder), rule, fix)]

    restore = "name a folder holding an EAGLE-3 checkpoint (config.json and safetensors)"
    if not Path(folder).is_dir():
        return bad("is not a folder on this machine", restore)
    from specdraft.fsutil import read_regular_file

    try:
        config = jsonfile.parse(read_regular_file(file, MAX_CONFIG_BYTES, CONFIG), str(file), restore)
    except jsonfile.BadJson as err:
        return bad(f"{file} is not JSON ({err.why})", restore)
    except UserError as err:
        return bad(err.message, restore)
    if not isinstance(config, dict):
        return bad(f"{file} holds {jsonfile.kind(config)}, not a JSON object", restore)
    found = jsonfile.problems(config, SHAPE)
    if found:
        return bad(f"{file}: {'; '.join(found[:10])}", restore)
    archs = config.get("architectures")
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != SPECULATORS:
            return bad(
                f"{file}: speculators_model_type {config['speculators_model_type']!r} is not an EAGLE-3 draft",
                f"use a speculators checkpoint with speculators_model_type {SPECULATORS!r}",
            )
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            return bad(f"{file}: a speculators config needs a transformer_layer_config mapping", restore)
        return _parse(file, "speculators", {**LLAMA_DEFAULTS, **layer}, config)
    if archs != [ARCHITECTURE]:
        return bad(
            f"{file}: architectures {archs!r} is no EAGLE-3 draft specdraft imports",
            f"use a {ARCHITECTURE} checkpoint (vLLM, SpecForge) or a speculators Eagle3Speculator one",
        )
    vllm = "eagle_aux_hidden_state_layer_ids" in config or "norm_before_residual" in config
    merged = {**LLAMA_DEFAULTS, **config}
    return _parse(file, "vllm" if vllm else "specforge", merged, config)


def _parse(file: Path, fmt: str, layer: dict, top: dict) -> tuple[Optional[DraftConfig], list[Finding]]:
    """``layer``: the decoder layer's keys (the whole config, or speculators' transformer_layer_config); ``top``:
    where the EAGLE-3 keys are (draft_vocab_size, aux ids, norm_before_residual)."""
    problems: list[Finding] = []

    def bad(rule: str, fix: str = "use a checkpoint whose draft specdraft's EAGLE-3 layer can build") -> None:
        problems.append(Finding("draft.path", str(file.parent), f"{file}: {rule}", fix))

    def integer(where: dict, key: str, default: Any = None) -> int:
        value = where.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            bad(f"{key} is {value!r}: must be a positive integer")
            return 1
        return value

    if fmt == "speculators" and layer.get("model_type", "llama") != "llama":
        bad(
            f"transformer_layer_config.model_type {layer.get('model_type')!r}: specdraft's draft layer is Llama's "
            "(a qwen3 layer adds QK norm)"
        )
    hidden = integer(layer, "hidden_size")
    heads = integer(layer, "num_attention_heads")
    # null and absent both mean the Llama defaults: MHA, hidden / heads
    layer = {**layer, "num_key_value_heads": layer.get("num_key_value_heads") or heads}
    layer["head_dim"] = layer.get("head_dim") or hidden // max(heads, 1)
    shape = dict(
        hidden_size=hidden,
        intermediate_size=integer(layer, "intermediate_size"),
        num_attention_heads=heads,
        num_key_value_heads=integer(layer, "num_key_value_heads"),
        head_dim=integer(layer, "head_dim"),
        num_layers=integer(layer, "num_hidden_layers", 1),
        vocab_size=integer(layer, "vocab_size"),
    )
    draft_vocab = integer(top, "draft_vocab_size", 32000 if fmt == "speculators" else shape["vocab_size"])
    for key in ("fc_norm", "norm_before_fc", "attention_bias", "mlp_bias"):
        if top.get(key) or layer.get(key):
            bad(f"{key} is true: specdraft's draft has no such norm or bias")
    nout = top.get("norm_output", False)
    if fmt == "specforge" and "norm_output" in top:
        # SpecForge's flag has meant two things: before its PR 879, false left the LM head's input un-normalised
        # and true was EAGLE-3; since, false is EAGLE-3 and true EAGLE-3.1. A SpecForge config cannot say which.
        said = str(nout).lower() if isinstance(nout, bool) else repr(nout)
        bad(
            f"norm_output is {said} in a SpecForge-layout config, where the flag's meaning changed between "
            "SpecForge versions",
            "drop norm_output from config.json for an EAGLE-3 draft, or write the checkpoint in vLLM's layout "
            "(a top-level eagle_aux_hidden_state_layer_ids) with norm_output as it was trained",
        )
    elif not isinstance(nout, bool):
        bad(f"norm_output is {nout!r}: must be true or false")
    if layer.get("hidden_act") != "silu":
        bad(f"hidden_act is {layer.get('hidden_act')!r}: specdraft's draft MLP is SwiGLU (silu)")
    target_hidden = top.get("target_hidden_size")
    if target_hidden is not None and target_hidden != hidden:
        bad(
            f"target_hidden_size {target_hidden!r} differs from hidden_size {hidden}: specdraft's fc reads taps "
            "of the draft's own width"
        )
    if "norm_before_residual" in top:
        nbr = top["norm_before_residual"]
        if not isinstance(nbr, bool):
            bad(f"norm_before_residual is {nbr!r}: must be true or false")
    elif fmt == "speculators":
        # speculators' own class defaults it to false, vLLM's speculators adapter reads a missing key as true.
        bad(
            "norm_before_residual is missing: speculators defaults it to false and vLLM reads it as true",
            "write norm_before_residual into the checkpoint's config.json as it was trained",
        )
    nbr = top.get("norm_before_residual", False) is True
    aux, said = _aux(top, fmt, bad)
    theta, scaling = _rope(layer, bad)
    eps = layer.get("rms_norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        bad(f"rms_norm_eps is {eps!r}: must be a number")
        eps = 0.0
    mpe = layer.get("max_position_embeddings")
    if mpe is not None and (isinstance(mpe, bool) or not isinstance(mpe, int) or mpe < 1):
        bad(f"max_position_embeddings is {mpe!r}: must be a positive integer")
        mpe = None
    if problems:
        return None, problems
    found = DraftConfig(
        file=str(file), format=fmt, **shape, draft_vocab_size=draft_vocab, aux_outputs=aux, aux_said=said,
        norm_before_residual=nbr, norm_output=nout is True,
        max_position_embeddings=mpe, rope_theta=float(theta), rope_scaling=scaling,
        rms_norm_eps=float(eps),
    )  # fmt: skip
    return found, []


def _ids(value: Any) -> Optional[list[int]]:
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def _aux(top: dict, fmt: str, bad) -> tuple[Optional[tuple[int, ...]], str]:
    """The taps in specdraft's numbering (layer outputs) and how the file said them."""
    key = AUX_KEY
    raw = top.get("eagle_config")
    nested: dict = raw if isinstance(raw, dict) else {}
    if key in top:
        ids = _ids(top[key])
        if ids is None or min(ids) < 1:
            bad(f"{key} is {top[key]!r}: must be a list of layer ids >= 1 ({INPUTS})")
            return None, ""
        outputs = tuple(i - 1 for i in ids)
        if key in nested and sorted(nested[key] or []) != sorted(outputs):
            # specdraft's export writes both: SGLang's eagle_config copy counts outputs, so it is the top-level - 1.
            bad(f"{key} {ids} ({INPUTS}) and eagle_config.{key} {nested[key]!r} ({OUTPUTS}) name different layers")
        return outputs, f"{key} {ids} ({INPUTS}; outputs {list(outputs)})"
    if key in nested:
        ids = _ids(nested[key])
        if ids is None or min(ids) < 0:
            bad(f"eagle_config.{key} is {nested[key]!r}: must be a list of layer ids >= 0 ({OUTPUTS})")
            return None, ""
        return tuple(ids), f"eagle_config.{key} {ids} ({OUTPUTS})"
    return None, f"no {key} (so EAGLE-3's default taps of the policy)"


def _rope(layer: dict, bad) -> tuple[float, Optional[dict]]:
    params: Any = layer.get("rope_parameters") if isinstance(layer.get("rope_parameters"), dict) else None
    theta: Any = (params or {}).get("rope_theta", layer.get("rope_theta"))
    scaling: Any = params if params is not None else layer.get("rope_scaling")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        bad(f"rope_theta is {theta!r}: must be a number")
        theta = 0.0
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else scaling
    if kind in (None, "default"):
        return theta, None
    names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    if kind != "llama3" or not all(isinstance(scaling.get(n), (int, float)) for n in names):
        bad(f"rope_scaling {scaling!r}: specdraft's draft builds Llama-3.1's llama3 scaling only")
        return theta, None
    return theta, {n: float(scaling[n]) for n in names}


def check(found: DraftConfig, want: Expected) -> tuple[list[Finding], list[str]]:
    """(what keeps ``found`` from initialising the draft ``want`` describes, notes): every field, both values."""
    out: list[Finding] = []
    f = found.file
    policy = "use a draft checkpoint trained for this policy, or leave draft.path out (random weights)"

    def differ(ckpt_key: str, got: Any, field: str, expected: Any, why: str, fix: str = policy) -> None:
        if got != expected:
            out.append(Finding("draft.path", str(Path(f).parent),
                               f"{f}: {ckpt_key} is {got!r}, but {field} is {expected!r}: {why}", fix))  # fmt: skip

    reads = "the draft reads the policy's hidden states and embeddings"
    differ("hidden_size", found.hidden_size, "model.hidden_size", want.hidden_size, reads)
    differ("intermediate_size", found.intermediate_size, "model.ffn_hidden_size", want.ffn_hidden_size,
           "specdraft's draft MLP is the policy's width")  # fmt: skip
    layer = "specdraft's draft layer has the policy's attention shape"
    differ("num_attention_heads", found.num_attention_heads, "model.num_attention_heads", want.num_attention_heads,
           layer)  # fmt: skip
    differ("num_key_value_heads", found.num_key_value_heads, "model.num_query_groups", want.num_query_groups, layer)
    differ("head_dim", found.head_dim, "model.kv_channels (the head dim)", want.head_dim, layer)
    differ("vocab_size", found.vocab_size, "model.vocab_size", want.vocab_size, "the draft's d2t/t2d index the "
           "policy's vocabulary")  # fmt: skip
    differ("num_hidden_layers", found.num_layers, "draft.num_layers", want.num_layers, "the draft's decoder layers",
           f"set draft.num_layers={found.num_layers}")  # fmt: skip
    vocab_fix = (f"set draft.vocab_size={found.draft_vocab_size}" if found.draft_vocab_size != want.vocab_size
                 else "leave draft.vocab_size out (the target's)")  # fmt: skip
    differ("draft_vocab_size", found.draft_vocab_size, "the draft vocabulary (draft.vocab_size"
           + (")" if want.draft_vocab_given else ", null: the target's)"), want.draft_vocab_size,
           "the LM head and d2t/t2d are that size", vocab_fix)  # fmt: skip
    taps = found.aux_outputs if found.aux_outputs is not None else want.default_aux
    if sorted(taps) != sorted(want.aux_layers):
        out.append(Finding(
            "draft.aux_layers", list(want.aux_layers),
            f"the taps of {f} are the outputs of layers {sorted(taps)} ({found.aux_said}), not the layout's "
            f"{list(want.aux_layers)} (specdraft counts layer outputs)",
            f"set draft.aux_layers={sorted(taps)}, or use a draft trained on the layout's taps",
        ))  # fmt: skip
    differ("norm_before_residual", found.norm_before_residual, "draft.norm_before_residual",
           want.norm_before_residual, "the first layer's residual must be what the draft was trained with",
           f"set draft.norm_before_residual={str(found.norm_before_residual).lower()}")  # fmt: skip
    differ("norm_output", found.norm_output, "draft.norm_output", want.norm_output, "each draft step after the "
           "first must read the hidden state the draft was trained to carry (post-norm under EAGLE-3.1)",
           f"set draft.norm_output={str(found.norm_output).lower()}")  # fmt: skip
    differ("rope_theta", found.rope_theta, "model.rotary_base", float(want.rotary_base), "the draft keeps the "
           "policy's RoPE")  # fmt: skip
    differ("rope_scaling", found.rope_scaling, "model.rope_scaling", want.rope_scaling, "the draft keeps the "
           "policy's RoPE")  # fmt: skip
    differ("rms_norm_eps", found.rms_norm_eps, "model.norm_epsilon", want.norm_epsilon, "the draft keeps the "
           "policy's norm epsilon")  # fmt: skip
    notes = []
    mpe = found.max_position_embeddings
    if mpe is not None and mpe < want.seq_length:
        notes.append(
            f"{f}: max_position_embeddings {mpe} is below model.seq_length {want.seq_length}; a draft served with "
            f"that limit loses its acceptance past position {mpe} (NeMo-RL PR 3960). specdraft trains it at every "
            "position and `specdraft export` writes the policy's max_position_embeddings"
        )
    return out, notes


MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on its JSON header


def tensor_names(folder: Path) -> set[str]:
    """The tensor names of the draft in ``folder``: model.safetensors' header (8-byte little-endian length, then
    JSON), else model.safetensors.index.json's weight_map; empty when neither can be read (the ranks say why)."""
    import struct

    try:
        index = Path(folder) / "model.safetensors.index.json"
        if index.is_file():
            found = jsonfile.parse(index.read_bytes()[:MAX_HEADER_BYTES], str(index))
            weights = found.get("weight_map", {}) if isinstance(found, dict) else {}
            return set(weights) if isinstance(weights, dict) else set()
        with open(Path(folder) / "model.safetensors", "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = jsonfile.parse(handle.read(min(length, MAX_HEADER_BYTES)), str(folder))
    except (OSError, struct.error, jsonfile.BadJson):
        return set()
    return set(header) - {"__metadata__"} if isinstance(header, dict) else set()


def vllm_refuses_d2t(folder: Path, found: DraftConfig) -> str | None:
    """Why vLLM (0.32) would refuse to load ``folder`` as a draft: a d2t tensor beside a full draft vocabulary. Its
    Eagle3LlamaForCausalLM makes draft_id_to_target_id only for a reduced one, and then fails the load with
    "There is no module or parameter named 'draft_id_to_target_id'". SpecForge and speculators save the identity
    d2t/t2d buffers for a full vocabulary all the same. None when vLLM loads it."""
    if found.draft_vocab_size != found.vocab_size or "d2t" not in tensor_names(folder):
        return None
    return (
        f"{folder} holds a d2t tensor with a full draft vocabulary (draft_vocab_size = vocab_size = "
        f'{found.vocab_size}), which vLLM refuses to load ("There is no module or parameter named '
        "'draft_id_to_target_id'\")"
    )


def import_notes(folder: Path, found: DraftConfig) -> list[str]:
    """Notes on a draft.path checkpoint that imports fine but that vLLM would not serve as it is."""
    refused = vllm_refuses_d2t(folder, found)
    if refused is None:
        return []
    return [
        f"draft.path: {refused}; the import ignores it and `specdraft export` writes none, so serve the run's "
        "export rather than this folder"
    ]
