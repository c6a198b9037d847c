"""The layout spec: frozen, keyword-only dataclasses. Each field's docstring is what `specdraft explain` prints.

Fields without a default are required. Names follow Megatron: tp, cp, pp, dp, ep, etp and "size".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from specdraft.spec.rl import GrpoSpec, RolloutSpec

REQUIRED = object()  # sentinel for documentation only; required fields simply have no default


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Llama-3.1's RoPE frequency scaling (HF rope_scaling with rope_type llama3)."""

    factor: float = 8.0
    """Divisor of the low frequencies (--rope-scaling-factor; HF rope_scaling.factor)."""
    low_freq_factor: float = 1.0
    """Wavelengths above original_max_position_embeddings / low_freq_factor are divided by factor."""
    high_freq_factor: float = 4.0
    """Wavelengths below original_max_position_embeddings / high_freq_factor are kept; those between blend."""
    original_max_position_embeddings: int = 8192
    """Context length the model was pre-trained at before the scaling."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The target model: its shape and what its layers are, as the model's published config says.

    When `path` names a local Hugging Face folder, its config.json fills every field the layout leaves out and a
    field the layout sets must agree with it, so a model section can be just `path` and `seq_length`.
    """

    num_layers: int
    """Number of transformer layers (Megatron --num-layers; HF num_hidden_layers)."""
    hidden_size: int
    """Model hidden size (HF hidden_size)."""
    ffn_hidden_size: int
    """Dense MLP hidden size (HF intermediate_size)."""
    num_attention_heads: int
    """Number of attention (query) heads."""
    num_query_groups: Optional[int] = None
    """Number of K/V heads for GQA (HF num_key_value_heads); null means equal to num_attention_heads (MHA)."""
    kv_channels: Optional[int] = None
    """Per-head dimension (HF head_dim); null means hidden_size / num_attention_heads."""
    vocab_size: int
    """Vocabulary size (padded or not; Megatron pads it to a multiple of 128*tp itself)."""
    seq_length: int
    """Training sequence length in tokens (per packed microbatch row)."""
    max_position_embeddings: Optional[int] = None
    """Context length the model was trained for (--max-position-embeddings; HF max_position_embeddings); null means
    seq_length. Megatron-LM needs it >= seq_length, so the render passes the larger of the two."""
    num_experts: Optional[int] = None
    """Number of routed MoE experts; null for a dense model."""
    moe_ffn_hidden_size: Optional[int] = None
    """Hidden size of each expert's MLP (HF moe_intermediate_size); required when num_experts is set."""
    moe_router_topk: int = 2
    """Experts each token is routed to (HF num_experts_per_tok)."""
    moe_aux_loss_coeff: float = 0.0
    """MoE router load-balancing loss coefficient (--moe-aux-loss-coeff; HF router_aux_loss_coef); 0 = off."""
    swiglu: bool = True
    """Gated (SwiGLU) MLP with three weight matrices (--swiglu; HF hidden_act silu); false for a plain GeLU MLP."""
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    """Norm of every layer, the final norm and the QK norm (--normalization; Megatron-LM's default is LayerNorm)."""
    norm_epsilon: float = 1.0e-5
    """Epsilon of every norm (--norm-epsilon; HF rms_norm_eps)."""
    add_bias_linear: bool = False
    """Biases in every linear layer: QKV, attention output and MLP (Megatron-LM's default is on; off renders
    --disable-bias-linear; HF attention_bias and mlp_bias both true)."""
    add_qkv_bias: bool = False
    """Biases in the QKV projection alone (--add-qkv-bias), for models without other biases."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities (--attention-dropout; Megatron-LM's default is 0.1; HF
    attention_dropout)."""
    hidden_dropout: float = 0.0
    """Dropout after the attention and MLP blocks (--hidden-dropout; Megatron-LM's default is 0.1)."""
    rotary_base: int = 10000
    """RoPE base theta (--rotary-base; HF rope_theta); positions are rotary (--position-embedding-type rope)."""
    rope_scaling: Optional[RopeScaling] = None
    """Llama-3.1's RoPE scaling (--use-rope-scaling, --rope-scaling-factor); null = none."""
    qk_layernorm: bool = False
    """Normalise each head's query and key before RoPE (--qk-layernorm; Qwen3)."""
    tie_embeddings: bool = False
    """Share the input embedding and output layer weights (HF tie_word_embeddings; untied renders
    --untie-embeddings-and-output-weights)."""
    path: Optional[str] = None
    """The policy's Hugging Face folder (its config.json fills the fields the layout leaves out; a launch reads its
    weights) or hub id (plans and renders only: launch refuses it, the ranks download nothing); null = seeded random
    weights, and the renders write the placeholder <model.path>."""
    config_sha256: Optional[str] = None
    """sha256 of the config.json that filled this section: specdraft records it when it reads `path` (leave it
    out). The plan's spec keeps the filled values, so recompiling a plan.json never needs the folder. Launching,
    rendering or validating a plan.json checks it where `path` is on that machine (its config.json must still have
    this hash) and trusts the recorded values where it is not (a login node without the checkpoint); `status` and
    `logs` never read the folder."""
    config_fields: list[str] = field(default_factory=list)
    """The model fields config.json filled, recorded with config_sha256 (leave it out)."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Where the training job runs."""

    num_nodes: int = 1
    """Number of nodes in the allocation."""
    gpus_per_node: int = 8
    """GPUs (ranks) per node; `--ntasks-per-node` in the sbatch script."""
    gpu: str = "h100-80gb"
    """Accelerator kind from the catalogue (`specdraft explain cluster.gpu` lists them); `cpu` for local runs."""
    executor: Optional[Literal["local", "slurm"]] = None
    """Where `specdraft launch` runs the plan: slurm (sbatch through submitit) or local (one process per rank on
    this machine); `launch --executor` overrides it. Null: launch refuses until one of the two says which, so it
    never submits to a cluster that merely happened to answer."""


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """The parallel layout, as Megatron-LM names it."""

    tp: int = 1
    """Tensor-parallel size (--tensor-model-parallel-size)."""
    cp: int = 1
    """Context-parallel size (--context-parallel-size)."""
    pp: int = 1
    """Pipeline-parallel size (--pipeline-model-parallel-size)."""
    dp: int = -1
    """Data-parallel size; -1 derives it as world_size / (tp * cp * pp)."""
    ep: int = 1
    """Expert-parallel size (--expert-model-parallel-size); needs model.num_experts."""
    etp: Optional[int] = None
    """Expert tensor-parallel size (--expert-tensor-parallel-size); null means equal to tp."""
    vpp: Optional[int] = None
    """Virtual pipeline stages per pipeline rank (--num-virtual-stages-per-pipeline-rank); null = no interleaving."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (--sequence-parallel); needs tp > 1."""
    first_stage_layers: Optional[int] = None
    """Layers on the first pipeline stage (--decoder-first-pipeline-num-layers); null = even split."""
    last_stage_layers: Optional[int] = None
    """Layers on the last pipeline stage (--decoder-last-pipeline-num-layers); null = even split."""
    account_for_embedding_in_pipeline_split: bool = False
    """The embedding counts as a layer of the pp x vpp split (--account-for-embedding-in-pipeline-split)."""
    account_for_loss_in_pipeline_split: bool = False
    """The output layer and loss count as a layer of the pp x vpp split (--account-for-loss-in-pipeline-split)."""
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = "p2p"
    """Context-parallel communication (--cp-comm-type); the draft's branch attention ring is p2p."""
    hierarchical_cp_sizes: Optional[list[int]] = None
    """Sizes for a2a+p2p (--hierarchical-context-parallel-sizes); their product must be cp."""
    order: Literal["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"] = "tp-cp-ep-dp-pp"
    """Rank order, innermost first; tp-cp-ep-pp-dp is Megatron's --use-tp-pp-dp-mapping."""


@dataclass(frozen=True, kw_only=True)
class DraftSpec:
    """The EAGLE-3 speculative-decoding draft, co-trained online next to the policy."""

    enabled: bool = True
    """Co-train a draft; false trains the policy alone."""
    method: Literal["eagle3"] = "eagle3"
    """Draft method; EAGLE-3 (fused low/mid/high taps, training-time test)."""
    num_layers: int = 1
    """Decoder layers in the draft (EAGLE-3 uses 1)."""
    aux_layers: Optional[list[int]] = None
    """0-indexed target layers whose outputs the draft taps; null = EAGLE-3 default [1, N//2-1, N-4]."""
    ttt_steps: int = 3
    """Training-time-test unroll steps (step 0 is the trunk, 1.. are branch steps); also the default draft length."""
    stage: Union[Literal["last", "first"], int] = "last"
    """Pipeline stage that holds the whole draft: last (default), first, or a stage index."""
    loss_weight: float = 1.0
    """lambda in L = L_policy + lambda * L_draft (forward KL against detached policy logits)."""
    lr: float = 1.0e-3
    """Learning rate of the draft's own optimizer."""
    lr_warmup_steps: Optional[int] = None
    """Draft optimizer steps over which its rate rises linearly to draft.lr; null = 20 with draft.path (a first step
    at the full rate wipes an imported draft's acceptance, docs/models.md), else 0."""
    clip_grad: float = 1.0
    """Gradient-norm clip of the draft's own clipping group; 0 disables it."""
    model: Optional[str] = None
    """The EAGLE-3 folder (absolute) or hub id rollout engines start from (vLLM speculative_config.model), e.g. a
    `specdraft export`; null = the renders write the placeholder <draft.model>, which vLLM refuses."""
    vocab_size: Optional[int] = None
    """Draft LM-head vocabulary: the target's most frequent training tokens (SpecForge's d2t/t2d); null = target's."""
    export_interval: int = 0
    """Steps between publishing the draft for vLLM/SGLang to RUN_DIR/draft/step-N/ (and after the last); 0 = off."""
    path: Optional[str] = None
    """Absolute path of a local EAGLE-3 checkpoint folder the draft starts from (vLLM's LlamaForCausalLMEagle3 as
    `specdraft export` writes it, SpecForge's, or speculators' Eagle3Speculator); null = random weights. It must fit
    the policy and this section: shapes, vocabularies, taps (in each format's numbering), norms (docs/models.md)."""
    norm_before_residual: bool = False
    """First draft layer's residual: hidden_norm's output (vLLM's norm_before_residual); false = the raw hidden."""
    norm_output: bool = True
    """TTT steps after the first read the post-norm output (EAGLE-3.1), false: the raw one; draft.path: its own."""
    refit_interval: int = 1
    """GRPO: RL steps between refits of the co-trained draft into the rollout engine (the policy refits every step)."""
    refit_policy: Literal["interval", "drift"] = "interval"
    """GRPO: when the co-trained draft is refit: every refit_interval steps, or `drift`: after a step whose engines'
    accept length fell more than refit_drift_margin below the draft's training-time accept length on that step."""
    refit_drift_margin: float = 0.2
    """Accept-length tokens the engines may fall below the training-time figure before a `drift` refit."""


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """Batching, precision and the optimizer."""

    micro_batch_size: int = 1
    """Sequences per microbatch per data-parallel rank."""
    global_batch_size: int = 8
    """Sequences per optimizer step across all data-parallel ranks."""
    packing: bool = True
    """Pack sequences (THD) with per-sequence padding; needed by the draft's CP branch attention."""
    sequence_lengths: Optional[list[int]] = None
    """Typical per-sequence lengths, used to report packing padding overhead; null = [model.seq_length]."""
    dtype: Literal["bf16", "fp16", "fp32", "fp8"] = "bf16"
    """Training dtype; fp8 = TransformerEngine FP8 GEMMs and fp8 weights on Hopper/Blackwell, bf16 activations."""
    grad_reduce_in_bf16: bool = False
    """Keep and reduce gradients in bf16, not fp32 (--grad-reduce-in-bf16; NVIDIA's benchmarks); bf16 or fp8 only."""
    tp_comm_overlap: Optional[bool] = None
    """Overlap TP collectives with GEMMs (--tp-comm-overlap, TE userbuffers) where tp > 1 and sequence_parallel;
    null = as NVIDIA's performance recipes set it (Megatron-Bridge: on wherever tp > 1), on GPU clusters only (TE)."""
    distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks (--use-distributed-optimizer; the Megatron render overlaps its
    communication with --overlap-grad-reduce and --overlap-param-gather)."""
    recompute: Literal["none", "selective", "full"] = "selective"
    """Activation recomputation as Megatron-LM's --recompute-granularity: selective recomputes core attention, full
    recomputes every layer (uniform, one layer per checkpoint). The runtime applies it and the memory estimate
    counts it."""
    train_iters: int = 20
    """Optimizer steps the runtime runs (`specdraft launch --steps` overrides it)."""
    warmup_steps: int = 0
    """Policy-only steps before the draft joins (a stand-in for starting RL from a pretrained policy)."""
    lr: float = 1.0e-3
    """Learning rate of the policy's optimizer."""
    clip_grad: float = 1.0
    """Gradient-norm clip of the policy; 0 disables it."""
    seed: int = 1234
    """Seed for initialisation, the synthetic data the runtime generates, and the data file's sample order."""
    save_interval: int = 0
    """Steps between checkpoints in RUN_DIR/checkpoints; the last step's is always saved (0: only it). USR2 too."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept in RUN_DIR/checkpoints; older ones go once a newer one is complete (>= 1)."""
    stop_grace_s: float = 300.0
    """Seconds a stopped local run's ranks get to finish their step and save before SIGKILL (Ctrl-C, `cancel`)."""
    data_drift_interval: int = 0
    """Steps between shifts of the synthetic data's Markov transitions (a drifting policy's data); 0 = no drift."""
    data_drift_fraction: float = 0.5
    """Fraction of tokens whose successors are redrawn (seeded) at each data drift shift."""


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """The training data: a local jsonl or parquet file tokenised with the model's tokenizer (docs/data.md), or,
    without one, the built-in seeded Markov chain (the demo's and the parity tests' data)."""

    path: Optional[str] = None
    """Absolute path of a local .jsonl or .parquet file; null = the built-in Markov chain (cotrain) or the built-in
    grpo.task (grpo). Its tokenizer and chat template are read from the model.path folder (transformers'
    AutoTokenizer, local files only). Under workload grpo it is the prompt file: each row's prompt is rendered with
    the chat template (generation prompt added) and its reference answer is what rewards compare with."""
    format: Literal["auto", "messages", "prompt_response", "problem_answer", "text"] = "auto"
    """What a row holds: chat `messages` ([{role, content}]; the last assistant turn is the reference answer),
    `prompt` and `response`, NeMo-RL's math rows `problem` and `expected_answer`, or `text` (cotrain only); auto =
    decided by the first row's fields. Loss falls on the assistant (response, answer) tokens only; on every token of
    `text`."""
    shuffle: bool = True
    """Shuffle the samples anew each epoch (seeded); false keeps the file's order."""
    seed: Optional[int] = None
    """Seed of the sample order; null = training.seed."""


@dataclass(frozen=True, kw_only=True)
class SlurmSpec:
    """How the job is submitted to Slurm (every value is shell-quoted before it reaches a script)."""

    partition: Optional[str] = None
    """Slurm partition (--partition); null = the cluster's default."""
    account: Optional[str] = None
    """Slurm account (--account)."""
    qos: Optional[str] = None
    """Slurm quality of service (--qos)."""
    time: str = "01:00:00"
    """Wall-clock limit, [D-]HH:MM:SS or minutes."""
    cpus_per_task: int = 8
    """CPUs per task (--cpus-per-task)."""
    mem: Optional[str] = None
    """Memory per node (--mem): a number with an optional K, M, G or T suffix (M when none), e.g. 500G; 0 asks for
    all of each node's memory; null = the partition's default."""
    container_image: Optional[str] = None
    """Pyxis container image (srun --container-image) in enroot's form [USER@][REGISTRY#]IMAGE[:TAG], e.g.
    nvcr.io#nvidia/nemo-rl:v0.4.0 (a '#', not a '/', after the registry), or an absolute path to a squashfs file;
    null runs on the host. The run folder is mounted at its own path; slurm.container_specdraft brings specdraft in."""
    container_mounts: list[str] = field(default_factory=list)
    """Pyxis mounts, SRC:DST[:FLAGS] each with absolute paths (--container-mounts); a local model.path, data.path
    or --resume-from checkpoint must lie under one DST (the run folder is mounted by specdraft itself)."""
    container_specdraft: Optional[Literal["image", "mount"]] = None
    """How specdraft gets into slurm.container_image (required with one): image = the image has this specdraft
    version installed; mount = the script mounts the specdraft package the launch runs from (read-only, at its own
    path) and puts it first on the payload's sys.path, so only torch and megatron-core must be in the image."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables exported in the job script."""
    extra_sbatch_args: list[str] = field(default_factory=list)
    """Extra `#SBATCH` arguments, e.g. ["--exclusive", "--constraint=h100"]."""
    max_requeues: int = 3
    """Self-requeues after the time-limit warning (USR2), each resuming from the checkpoint saved then; 0 = never.
    Above 0 the script asks for --requeue. On the host rank 0 runs `scontrol requeue`; in a container (which has
    no Slurm client) it leaves a request in the run folder and the batch script requeues once srun returns."""


@dataclass(frozen=True, kw_only=True)
class LayoutSpec:
    """A whole layout: model, cluster, parallelism, draft, training, data, Slurm and rollout."""

    name: str
    """Layout name; used in job names and run folders (letters, digits, '.', '_' and '-')."""
    workload: Literal["cotrain", "grpo", "selftest"] = "cotrain"
    """What `specdraft launch` runs unless --workload says otherwise: the co-training job, GRPO (docs/grpo.md) or the
    collectives self-test."""
    model: ModelSpec
    """The target (policy) model's shape."""
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    """Nodes and accelerators."""
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    """TP/CP/PP/DP/EP layout."""
    draft: DraftSpec = field(default_factory=DraftSpec)
    """The co-trained EAGLE-3 draft."""
    training: TrainingSpec = field(default_factory=TrainingSpec)
    """Batching, precision, optimizer."""
    data: DataSpec = field(default_factory=DataSpec)
    """The training data (a jsonl or parquet file, or the built-in Markov chain)."""
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    """Slurm submission settings."""
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    """Rollout instances and scheduling."""
    grpo: GrpoSpec = field(default_factory=GrpoSpec)
    """The GRPO workload's rollouts, rewards and loss."""
