"""The model section from a Hugging Face config.json: when a layout's `model.path` names a local folder, its
config.json (plain JSON; transformers is not imported) fills every model field the layout leaves out, and a field
the layout sets must agree with it. The file's sha256 and the filled fields are recorded in the spec."""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdraft import hf_files, jsonfile
from specdraft.errors import Problem, SpecError, UserError
from specdraft.spec.derived import head_dim, kv_heads
from specdraft.spec.schema import ModelSpec

CONFIG_NAME = "config.json"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB
SUPPORTED = ("LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM")
# The required model fields a config.json fills (seq_length is the layout's own).
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
# transformers' model_type of each, for a config.json written without `architectures` (a config saved alone).
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
# transformers' class defaults for the keys a config.json may leave out (LlamaConfig, Qwen3Config, MixtralConfig,
# Qwen3MoeConfig of transformers 5), so a sparse file means what transformers reads from it.
COMMON_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,
    "head_dim": None,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "sliding_window": None,
    "use_sliding_window": False,
    "rope_scaling": None,
    "router_aux_loss_coef": 0.001,
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048},
    "Qwen3ForCausalLM": {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 32768},
    "MixtralForCausalLM": {
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "max_position_embeddings": 131072,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "Qwen3MoeForCausalLM": {
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "num_local_experts": 128,  # the hub's files say num_experts, transformers 5 writes num_local_experts
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}


@dataclass(frozen=True)
class HfConfig:
    """What one config.json says, in the spec's terms."""

    file: str
    sha256: str
    values: dict[str, Any]  # model field -> value (rope_scaling as a mapping, as a layout writes it)
    keys: dict[str, str]  # model field -> the config.json key it comes from


def layout_path(data: Any) -> str | None:
    """The `model.path` a layout sets (the default `model` is a placeholder, never read)."""
    model = data.get("model") if isinstance(data, dict) else None
    path = model.get("path") if isinstance(model, dict) else None
    return path if isinstance(path, str) and path else None


def read(data: dict, source: str) -> HfConfig | None:
    """The config.json of the local folder the layout's model.path names; None when model.path is no folder on
    this machine (a hub id, or a checkpoint elsewhere). Raise SpecError for a folder without a usable one."""
    path = layout_path(data)
    if path is None or not Path(path).is_dir():
        return None
    file = Path(path) / CONFIG_NAME

    def fail(rule: str, fix: str):
        raise SpecError([Problem(path="model.path", value=path, rule=rule, fix=fix)], source)

    if not file.exists():
        # A folder of tokenizer files alone is fine beside a model section that is written out in full.
        unset = [f"model.{f}" for f in SHAPE_FIELDS if f not in data["model"]]
        if not unset:
            return None
        fail(
            f"is a folder without {CONFIG_NAME}, and the layout leaves {', '.join(unset)} unset",
            "point model.path at a Hugging Face checkpoint folder (config.json, safetensors, tokenizer files), "
            "or write those fields",
        )
    from specdraft.fsutil import read_regular_file

    try:
        raw = read_regular_file(file, MAX_CONFIG_BYTES, CONFIG_NAME)
    except UserError as err:
        fail(err.message, err.fix)
    restore = f"restore the checkpoint's {CONFIG_NAME}"
    try:
        config = jsonfile.parse(raw, str(file), restore)
    except jsonfile.BadJson as err:
        fail(f"{file} is not JSON ({err.why})", restore)
    if not isinstance(config, dict):
        fail(f"{file} holds {jsonfile.kind(config)}, not a JSON object", restore)
    found = jsonfile.problems(config, hf_files.CONFIG)
    if found:
        fail(f"{file}: {'; '.join(found[:10])}", restore)
    archs = config.get("architectures")
    if archs is None and config.get("model_type") in MODEL_TYPES:  # a config saved without its model
        archs = [MODEL_TYPES[config["model_type"]]]
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else archs
    if arch not in SUPPORTED:
        what = f"architectures {archs!r}" if archs is not None else f"model_type {config.get('model_type')!r}"
        fail(
            f"{file}: {what} is not supported; specdraft builds {', '.join(SUPPORTED)}",
            "use a checkpoint of a supported family, or leave model.path out and write the model fields",
        )
    values, keys, problems = model_fields({**COMMON_DEFAULTS, **DEFAULTS[arch], **config}, arch, str(file))
    if problems:
        raise SpecError(problems, source)
    return HfConfig(file=str(file), sha256=hashlib.sha256(raw).hexdigest(), values=values, keys=keys)


def model_fields(c: dict, arch: str, file: str) -> tuple[dict, dict, list[Problem]]:
    """(model field -> value, model field -> config.json key, problems) of config ``c`` (defaults merged in)."""
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    problems: list[Problem] = []

    def bad(key: str, rule: str, shown: Any = None) -> None:
        shown = c.get(key) if shown is None else shown
        problems.append(
            Problem(
                path="model.path",
                value=file,
                rule=f"config.json's {key} is {shown!r}: {rule}",
                fix="use a checkpoint whose config.json specdraft can build, or leave model.path out and write the "
                "model fields",
            )
        )

    def put(field: str, key: str, value: Any) -> None:
        values[field], keys[field] = value, key

    def integer(field: str, key: str, optional: bool = False) -> None:
        value = c.get(key)
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            bad(key, "must be a positive integer")
        else:
            put(field, key, value)

    def number(field: str, key: str) -> None:
        value = c.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad(key, "must be a number")
        else:
            put(field, key, float(value))

    for field, key in (
        ("num_layers", "num_hidden_layers"),
        ("hidden_size", "hidden_size"),
        ("ffn_hidden_size", "intermediate_size"),
        ("num_attention_heads", "num_attention_heads"),
        ("vocab_size", "vocab_size"),
        ("max_position_embeddings", "max_position_embeddings"),
    ):
        integer(field, key)
    integer("num_query_groups", "num_key_value_heads", optional=True)
    integer("kv_channels", "head_dim", optional=True)
    number("norm_epsilon", "rms_norm_eps")
    number("attention_dropout", "attention_dropout")
    put("normalization", "architectures", "RMSNorm")
    put("qk_layernorm", "architectures", arch in QK_NORM)
    put("add_qkv_bias", "attention_bias", False)
    if not isinstance(c.get("tie_word_embeddings"), bool):
        bad("tie_word_embeddings", "must be true or false")
    else:
        put("tie_embeddings", "tie_word_embeddings", c["tie_word_embeddings"])
    if c.get("hidden_act") != "silu":
        bad("hidden_act", "specdraft builds SwiGLU MLPs (hidden_act silu) only")
    else:
        put("swiglu", "hidden_act", True)
    attention_bias, mlp_bias = c.get("attention_bias"), c.get("mlp_bias")
    if attention_bias != mlp_bias:
        bad(
            "attention_bias",
            f"with mlp_bias {mlp_bias!r}: Megatron biases either every linear layer (add_bias_linear) or the QKV "
            "projection alone (add_qkv_bias), not q/k/v/o without the MLP",
        )
    else:
        put("add_bias_linear", "attention_bias", bool(attention_bias))
    if c.get("sliding_window") is not None and (arch == "MixtralForCausalLM" or c.get("use_sliding_window")):
        bad("sliding_window", "specdraft's attention is full causal attention, without a sliding window")
    _rope(c, put, bad)
    if arch == "MixtralForCausalLM":
        integer("num_experts", "num_local_experts")
        integer("moe_ffn_hidden_size", "intermediate_size")
    elif arch == "Qwen3MoeForCausalLM":
        integer("num_experts", "num_experts" if "num_experts" in c else "num_local_experts")
        integer("moe_ffn_hidden_size", "moe_intermediate_size")
        if c.get("mlp_only_layers") or c.get("decoder_sparse_step") != 1:
            bad("mlp_only_layers", "specdraft builds every layer as MoE (decoder_sparse_step 1, no mlp_only_layers)")
        if c.get("norm_topk_prob") is not True:
            bad(
                "norm_topk_prob", "Megatron's default router renormalises the top-k probabilities (norm_topk_prob true)"
            )
    else:
        put("num_experts", "architectures", None)
        put("moe_ffn_hidden_size", "architectures", None)
    if arch in ("MixtralForCausalLM", "Qwen3MoeForCausalLM"):
        integer("moe_router_topk", "num_experts_per_tok")
        number("moe_aux_loss_coeff", "router_aux_loss_coef")
    return values, keys, problems


def _rope(c: dict, put, bad) -> None:
    """rotary_base and rope_scaling from transformers 5's rope_parameters, or the hub's rope_theta/rope_scaling."""
    params = c.get("rope_parameters")
    theta: Any
    scaling: Any
    if isinstance(params, dict):
        theta, scaling, key = params.get("rope_theta", c.get("rope_theta")), params, "rope_parameters"
    else:
        theta, scaling, key = c.get("rope_theta"), c.get("rope_scaling"), "rope_scaling"
    number = isinstance(theta, (int, float)) and not isinstance(theta, bool) and math.isfinite(theta)
    if number and theta >= 2 and theta == int(theta):
        put("rotary_base", "rope_theta", int(theta))
    else:
        bad("rope_theta", "Megatron's --rotary-base is an integer >= 2", theta)
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else scaling
    if kind in (None, "default"):
        put("rope_scaling", key, None)
    elif kind != "llama3":
        bad(key, f"rope_type {kind!r}: specdraft builds Llama-3.1's llama3 scaling only", scaling)
    else:
        names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [n for n in names if not isinstance(scaling.get(n), (int, float)) or isinstance(scaling.get(n), bool)]
        if missing:
            bad(key, f"llama3 scaling needs numbers {', '.join(missing)}", scaling)
        else:
            put("rope_scaling", key, {n: scaling[n] for n in names})


def fill(data: dict, hf: HfConfig, source: str) -> set[str]:
    """Fill the model fields ``data`` leaves out from ``hf`` and record it; return the fields the layout gave."""
    model = data["model"]
    recorded = model.get("config_sha256")
    if recorded is not None and recorded != hf.sha256:
        raise SpecError(
            [
                Problem(
                    path="model.config_sha256",
                    value=recorded,
                    rule=f"{hf.file} now has sha256 {hf.sha256}: the checkpoint's config changed since it was recorded",
                    fix="drop model.config_sha256 and model.config_fields (specdraft records them), or restore the "
                    "checkpoint",
                )
            ],
            source,
        )
    given = {f for f in hf.values if f in model}
    filled = sorted(f for f in hf.values if f not in model)
    for f in filled:
        model[f] = hf.values[f]
    model["config_sha256"] = hf.sha256
    model["config_fields"] = filled
    return given


def _resolved(m: ModelSpec, field: str) -> Any:
    if field == "num_query_groups":
        return kv_heads(m)
    if field == "kv_channels":
        return head_dim(m)
    if field == "max_position_embeddings":
        return m.max_position_embeddings if m.max_position_embeddings is not None else m.seq_length
    if field == "rope_scaling":
        return asdict(m.rope_scaling) if m.rope_scaling is not None else None
    return getattr(m, field)


def disagreements(m: ModelSpec, hf: HfConfig, given: set[str]) -> list[Problem]:
    """Every field the layout set to something other than config.json's value, naming both and the key."""
    out = []
    for field in sorted(given):
        want, got = hf.values[field], _resolved(m, field)
        if got != want:
            out.append(
                Problem(
                    path=f"model.{field}",
                    value=getattr(m, field) if field != "rope_scaling" else got,
                    rule=f"disagrees with {hf.file}: its {hf.keys[field]} gives {want!r}",
                    fix=f"drop model.{field} from the layout (config.json fills it), or point model.path at the "
                    "checkpoint this layout describes",
                )
            )
    return out


# What a launch reads the policy's weights from (the runtime takes safetensors only, and names a .bin folder).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def weights_note(path: str | None) -> str | None:
    """The note for a model.path folder holding config.json and no weights, which everything but a launch takes
    (planning a cluster run from a model's config is the first thing a user does); None otherwise."""
    folder = Path(path).expanduser() if path is not None else None
    if folder is None or not (folder / CONFIG_NAME).is_file():
        return None
    if any((folder / name).exists() for name in WEIGHT_FILES) or any(folder.glob("*.safetensors")):
        return None
    return (
        f"model.path {path} holds {CONFIG_NAME} and no weights (neither model.safetensors nor "
        "model.safetensors.index.json): plan, validate, search, render and launch --dry-run use its config; "
        "a launch needs the weights in that folder"
    )


def no_tokenizer(path: str | None) -> str | None:
    """Why the local folder model.path names cannot serve as the policy's tokenizer; None when it can, or when
    model.path is no folder here (a hub id)."""
    from specdraft.datafile import TOKENIZER_FILES

    folder = Path(path).expanduser() if path is not None else None
    if folder is None or not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    return f"model.path {path} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})"


def check_recorded(m: ModelSpec, source: str) -> None:
    """A plan's model section against its checkpoint, where that is on this machine: the config.json at model.path
    must still have the recorded sha256. Absent (a login node without the checkpoint), the recorded values stand."""
    if m.config_sha256 is None or m.path is None or not Path(m.path).is_dir():
        return
    file = Path(m.path) / CONFIG_NAME
    from specdraft.fsutil import read_regular_file

    try:
        now = hashlib.sha256(read_regular_file(file, MAX_CONFIG_BYTES, CONFIG_NAME)).hexdigest()
    except UserError as err:
        now = f"unreadable ({err.message})"
    if now != m.config_sha256:
        raise SpecError(
            [
                Problem(
                    path="model.config_sha256",
                    value=m.config_sha256,
                    rule=f"{file} is not the config.json this plan was compiled from (sha256 now {now})",
                    fix="recompile the plan from the layout (`specdraft plan LAYOUT -o plan.json`)",
                )
            ],
            source,
        )
