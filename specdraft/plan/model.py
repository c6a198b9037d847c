"""LaunchPlan: the compiled plan as a versioned contract of frozen, typed sections.

Everything after compile (render, execute, runtime, status) reads a plan through `LaunchPlan.from_json`, which checks
`schema_version` and every field's type; JSON out is deterministic (same spec, byte-identical text).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

from specdraft.plan.codec import PlanFormatError, decode, encode_rows, encode_value
from specdraft.plan.dims import ParallelDims
from specdraft.plan.grpo import GrpoPlan
from specdraft.plan.rollout import RolloutPlan
from specdraft.plan.settings import ClusterPlan, RolloutSettings, SlurmPlan, TrainingPlan
from specdraft.spec.schema import LayoutSpec, RopeScaling

# 3: the model section says what the model is (norm, biases, dropout, RoPE, QK norm, path); 4: the data section.
# 5: `parallel` is the resolved ParallelDims (world_size and num_microbatches moved into it, the batch and layer
# split added); cluster, training and rollout_settings sections; slurm and draft carry their settings.
# 6: the model section records the config.json that filled it.
# 7: rollout_settings says whether rollout is colocated, on how many dedicated nodes, and max_response_length
# (the NeMo-RL render reads them).
# 8: cluster.executor; slurm.mem and slurm.container_specdraft.
# 9: the draft's path and norm_before_residual.
# 10: the grpo section, draft.refit_interval.
# 11: grpo.draft_mode (cotrain or frozen after the SFT warm-up).
# 12: workload, what launch runs by default.
# 13: draft.lr_warmup_steps; model.path and draft.model may be null (no checkpoint: the renders say so);
# rollout_settings.schedule; a grpo layout always plans its rollout instances (`rollout`).
# 14: draft.norm_output.
# 15: rollout.adaptive_k (rollout.adaptive_k: the k-by-batch schedule and its cost table); draft.refit_policy
# and refit_drift_margin.
SCHEMA_VERSION = 15
Tap = Union[int, str]  # a target layer index, or "embedding" / "logits"


class PlanVersionError(PlanFormatError):
    """A plan.json written for another schema version."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The target model with every default resolved, computed once at compile time: its shape and what its layers
    are. Renders and the runtime build the model from this section alone."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int  # K/V heads (num_attention_heads under MHA)
    head_dim: int  # kv_channels, else hidden_size / num_attention_heads
    kv_channels: Optional[int]  # as the layout gives it: the Megatron render passes --kv-channels only then
    vocab_size: int
    seq_length: int
    max_position_embeddings: int  # the model's trained context; seq_length when the spec leaves it null
    num_experts: Optional[int]
    moe_ffn_hidden_size: Optional[int]
    moe_router_topk: int
    moe_aux_loss_coeff: float
    swiglu: bool
    normalization: str  # RMSNorm | LayerNorm
    norm_epsilon: float
    add_bias_linear: bool
    add_qkv_bias: bool
    attention_dropout: float
    hidden_dropout: float
    rotary_base: int
    rope_scaling: Optional[RopeScaling]
    qk_layernorm: bool
    tie_embeddings: bool
    path: Optional[str]  # checkpoint folder or hub id; None = random weights
    config_sha256: Optional[str]  # the config.json that filled the model section, when one did
    config_fields: tuple[str, ...]  # the fields it filled


@dataclass(frozen=True, kw_only=True)
class DataPlan:
    """The training data with its defaults resolved: a local file (tokenised on every rank, docs/data.md) or, with
    ``path`` None, the built-in seeded Markov chain."""

    path: Optional[str]  # absolute .jsonl or .parquet file; None = the Markov chain
    format: str  # auto | messages | prompt_response | text (auto: the first row's fields decide)
    tokenizer: Optional[str]  # the folder AutoTokenizer reads (model.path); None for the Markov chain
    shuffle: bool
    seed: int  # data.seed, else training.seed: the sample order (and the Markov chain's rows)
    length_multiple: int  # every packed sequence's length is a multiple: lcm(16, parallel.pad_multiple)
    drift_interval: int  # the Markov chain's drift (training.data_drift_*); 0 for a file
    drift_fraction: float


@dataclass(frozen=True, kw_only=True)
class RankPlacement:
    """One global rank: where it runs and its coordinates in every parallel dimension."""

    global_rank: int
    node: int
    local_rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    etp: int
    edp: int


@dataclass(frozen=True, kw_only=True)
class ChunkPlan:
    """One virtual pipeline chunk of a stage (0-indexed, inclusive layer range)."""

    vpp: int
    first_layer: int
    last_layer: int
    num_layers: int


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """One pipeline rank's layers; `chunks` lists its model chunks in schedule order (one without vpp)."""

    pp: int
    first_layer: Optional[int]
    last_layer: Optional[int]
    num_layers: int
    chunks: tuple[ChunkPlan, ...]


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """Estimated bytes per GPU on one pipeline stage."""

    pp: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    draft: int
    total: int
    hbm: int
    fraction: float


@dataclass(frozen=True, kw_only=True)
class PaddingReport:
    """Packing overhead of padding every sequence to the CP multiple."""

    pad_multiple: int
    sequence_lengths: tuple[int, ...]
    padded_lengths: tuple[int, ...]
    padding_overhead: float
    expected_pad_tokens_per_sequence: float


@dataclass(frozen=True, kw_only=True)
class DraftPlan:
    """Where the EAGLE-3 draft lives, what it needs, and its settings (set, from the spec, when it is off too)."""

    enabled: bool
    stage: Optional[int]
    ranks: tuple[int, ...]
    aux_layers: tuple[int, ...]
    cp_attention: str  # zigzag_ring_branch_merge when cp > 1, else off
    num_params: int
    memory_bytes: int
    landing_slots: int
    padding: Optional[PaddingReport]
    method: str
    num_layers: int
    ttt_steps: int
    vocab_size: int  # draft.vocab_size, else the target's
    loss_weight: float
    lr: float
    lr_warmup_steps: int  # draft optimizer steps over which its rate rises linearly to lr
    clip_grad: float
    model: Optional[str]  # the draft checkpoint rollout engines load; None = not known yet
    export_interval: int
    path: Optional[str]  # the EAGLE-3 checkpoint folder the draft starts from; None = random weights
    norm_before_residual: bool  # layer 0's residual is hidden_norm's output (vLLM's norm_before_residual)
    norm_output: bool  # a TTT step after the first reads the previous one's post-norm hidden state (EAGLE-3.1)
    refit_interval: int  # GRPO: steps between refits of the draft into the rollout engine
    refit_policy: str  # interval | drift (rl/drift.py decides)
    refit_drift_margin: float


@dataclass(frozen=True, kw_only=True)
class TapSummary:
    """One tap the draft reads: its source stage/chunk, routes and traffic."""

    tap: Tap
    src_stage: int
    src_chunk: int
    dst_stage: int
    local: bool
    num_routes: int
    num_cross_node: int
    bytes_per_microbatch: int
    bytes_per_step: int


@dataclass(frozen=True, kw_only=True)
class TapRoute:
    """One TapChannel route: a source rank sends one tap to the draft rank with the same (tp, cp, dp)."""

    tap: Tap
    src_rank: int
    dst_rank: int
    src_stage: int
    src_chunk: int
    dst_stage: int
    bytes_per_microbatch: int
    cross_node: bool
    local: bool


@dataclass(frozen=True, kw_only=True)
class TapTraffic:
    """Tap bytes per step against the pipeline's own P2P bytes."""

    bytes_per_step: int
    cross_node_bytes_per_step: int
    pipeline_activation_bytes_per_step: int


@dataclass(frozen=True, kw_only=True)
class PlanWarning:
    """A validation warning carried in the plan (the same fields as a Problem)."""

    path: str
    value: Any
    rule: str
    fix: str


@dataclass(frozen=True, kw_only=True)
class VllmRender:
    """vLLM engine arguments shared by every rollout instance, and what specdraft's schema says of them."""

    engine_args: dict
    num_instances: int
    problems: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Renders:
    """The plan rendered for other tools."""

    megatron: tuple[str, ...]  # the exact Megatron-LM argv (Megatron-LM's own flags only)
    nemo_rl: dict  # NeMo-RL overrides, nested as its YAML configs
    vllm: VllmRender


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything a launch needs; `runtime/` reads it back from plan.json and nothing else."""

    schema_version: int
    specdraft_version: str
    name: str
    workload: str  # what launch runs unless --workload says otherwise
    spec_sha256: str
    spec: LayoutSpec  # provenance: what the plan was compiled from; consumers read the resolved sections below
    model: ModelShape
    cluster: ClusterPlan
    parallel: ParallelDims
    training: TrainingPlan
    slurm: SlurmPlan
    data: DataPlan
    ranks: tuple[RankPlacement, ...]
    stages: tuple[StagePlan, ...]
    memory: tuple[StageMemory, ...]
    draft: DraftPlan
    taps: tuple[TapSummary, ...]
    tap_routes: tuple[TapRoute, ...]
    tap_traffic: TapTraffic
    warnings: tuple[PlanWarning, ...]
    rollout_settings: RolloutSettings
    grpo: GrpoPlan
    renders: Optional[Renders]  # None only between compile_core and assembly
    rollout: Optional[RolloutPlan]  # None when rollout planning is off (rollout.enabled false, workload not grpo)

    def to_json(self) -> str:
        """Deterministic JSON: section order fixed by the dataclass, field order by each section's dataclass.

        The per-rank and per-route lists are written one compact object per line: readable, diffable, and
        encoded by the C encoder (an indented dump of a 16K-rank plan is 5x slower).
        """
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("ranks", "tap_routes") and value:
                body = encode_rows(value)
            else:
                body = json.dumps(encode_value(value), indent=1, ensure_ascii=True).replace("\n", "\n ")
            parts.append(f" {json.dumps(f.name)}: {body}")
        return "{\n" + ",\n".join(parts) + "\n}\n"

    @property
    def plan_hash(self) -> str:
        """sha256 of the plan JSON; its first 8 hex digits name the run folder and the job."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @property
    def run_name(self) -> str:
        """`<layout name>-<plan hash 8>`: the run folder's name and the Slurm job name."""
        return f"{self.name}-{self.plan_hash[:8]}"

    @property
    def world_size(self) -> int:
        """parallel.world_size, which launchers and status read often."""
        return self.parallel.world_size

    @property
    def num_microbatches(self) -> int:
        """parallel.num_microbatches: microbatches per data-parallel rank and step."""
        return self.parallel.num_microbatches

    def stage_of(self, global_rank: int) -> StagePlan:
        return self.stages[self.ranks[global_rank].pp]

    @classmethod
    def from_json(cls, text: str) -> "LaunchPlan":
        """Parse plan.json; refuse another schema_version (naming both) or any field of the wrong shape."""
        from specdraft import jsonfile

        try:  # the bounded parser: a huge integer, NaN or deep nesting is a refusal, not a traceback
            data = jsonfile.parse(text, "the plan")
        except jsonfile.BadJson as err:
            raise PlanFormatError(f"not JSON ({err.why[:200]})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "LaunchPlan":
        if not isinstance(data, dict):
            raise PlanFormatError(f"a plan is a JSON object, not {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlanVersionError(
                f"plan schema_version is {version!r}, but this specdraft reads schema_version "
                f"{SCHEMA_VERSION} (written by specdraft {data.get('specdraft_version', '?')!s:.40})"
            )
        return decode(cls, data, "", spec_decoder=_decode_spec)


def _decode_spec(data: Any, path: str) -> LayoutSpec:
    from specdraft.spec.load import build  # pure: the dataclass builder, no OmegaConf

    spec, problems = build(LayoutSpec, data, "")
    if problems:
        first = problems[0]
        raise PlanFormatError(
            f"{path}.{first.path}: {first.rule}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    return spec
