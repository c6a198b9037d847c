"""The exact Megatron-LM argv for a layout: only flags Megatron-LM's parser defines (pretrain_gpt.py refuses any
other), building the model the plan's model section names. What specdraft's runtime needs (the draft, its taps,
the CP attention) stays in plan.json."""

from __future__ import annotations

from specdraft.plan.model import LaunchPlan, ModelShape
from specdraft.render.paths import MODEL_PLACEHOLDER, model_path

TOKENIZER_FLAGS = ("--tokenizer-type", "--tokenizer-model")


def megatron_argv(plan: LaunchPlan) -> tuple[str, ...]:
    """Flags in a fixed order: parallelism, model, batching/precision, optimizer."""
    m, p, t = plan.model, plan.parallel, plan.training
    args = [
        "--tensor-model-parallel-size",
        str(p.tp),
        "--pipeline-model-parallel-size",
        str(p.pp),
        "--context-parallel-size",
        str(p.cp),
    ]
    if p.cp > 1:
        args += ["--cp-comm-type", p.cp_comm_type]
        if p.hierarchical_cp_sizes:
            args += ["--hierarchical-context-parallel-sizes", *map(str, p.hierarchical_cp_sizes)]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if m.num_experts:
        args += ["--expert-model-parallel-size", str(p.ep), "--expert-tensor-parallel-size", str(p.etp)]
    if p.vpp:
        args += ["--num-virtual-stages-per-pipeline-rank", str(p.vpp)]
    if p.first_stage_layers is not None:
        args += ["--decoder-first-pipeline-num-layers", str(p.first_stage_layers)]
    if p.last_stage_layers is not None:
        args += ["--decoder-last-pipeline-num-layers", str(p.last_stage_layers)]
    if p.account_for_embedding_in_pipeline_split:
        args.append("--account-for-embedding-in-pipeline-split")
    if p.account_for_loss_in_pipeline_split:
        args.append("--account-for-loss-in-pipeline-split")
    if p.order == "tp-cp-ep-pp-dp":
        args.append("--use-tp-pp-dp-mapping")
    args += model_args(m)
    if m.num_experts:
        args += [
            "--num-experts",
            str(m.num_experts),
            "--moe-ffn-hidden-size",
            str(m.moe_ffn_hidden_size),
            "--moe-router-topk",
            str(m.moe_router_topk),
            # What specdraft's runtime runs: the all-to-all dispatcher and this load-balancing coefficient.
            "--moe-token-dispatcher-type",
            "alltoall",
            "--moe-aux-loss-coeff",
            repr(m.moe_aux_loss_coeff),
        ]
        if m.moe_router_topk == 1:
            args.append("--moe-router-pre-softmax")  # megatron-core refuses top-1 softmax routing without it
    args += [TOKENIZER_FLAGS[0], "HuggingFaceTokenizer", TOKENIZER_FLAGS[1], model_path(plan)]
    args += ["--micro-batch-size", str(p.micro_batch_size), "--global-batch-size", str(p.global_batch_size)]
    if t.dtype == "fp8":
        # FP8 GEMMs through TransformerEngine with per-tensor current scaling and fp8 parameters, bf16 elsewhere
        # (the recipe of NVIDIA's published H100 FP8 figures; Megatron-LM's --fp8-* flags).
        args += ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]
    elif t.dtype != "fp32":
        args.append(f"--{t.dtype}")
    if t.grad_reduce_in_bf16:
        args.append("--grad-reduce-in-bf16")
    if t.tp_comm_overlap:  # resolved by compile: tp > 1, sequence parallel, a GPU cluster (spec.derived)
        args.append("--tp-comm-overlap")
    if t.distributed_optimizer:
        # Overlapped as in NVIDIA's performance recipes: the step estimate (perf/costs.py, dp_exposed) counts only a
        # fifth of the distributed optimizer's reduce-scatter and all-gather, which holds only with these two on.
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if t.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif t.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    args += [
        "--lr",
        repr(t.lr),
        "--clip-grad",
        repr(t.clip_grad),
        "--seed",
        str(t.seed),
        "--train-iters",
        str(t.train_iters),
    ]
    return tuple(args)


def megatron_text(plan: LaunchPlan, no_tokenizer: str | None = None) -> str:
    """What `render --to megatron` prints: comments on what the argv does not carry, then the argv, one flag a line
    (format_argv). ``no_tokenizer`` (why model.path's folder cannot serve as the tokenizer) leaves those flags out."""
    import textwrap

    argv = list(megatron_argv(plan) if plan.renders is None else plan.renders.megatron)
    notes = [
        f"Megatron-LM flags of layout {plan.name} (pretrain_gpt.py). Not carried: the EAGLE-3 draft (draft.*: its "
        "stage, taps, training-time test and loss) and the rollout side; Megatron-LM trains the policy alone, "
        "specdraft's runtime trains both (plan.json)."
    ]
    if no_tokenizer is not None:
        at = argv.index(TOKENIZER_FLAGS[0])
        del argv[at : at + 4]
        notes.append(
            f"Not carried: the tokenizer ({no_tokenizer}): add --tokenizer-type HuggingFaceTokenizer "
            "--tokenizer-model FOLDER, a folder holding the policy's tokenizer files."
        )
    elif plan.model.path is None:
        notes.append(
            f"--tokenizer-model is the placeholder {MODEL_PLACEHOLDER} (model.path is unset): set model.path to the "
            "policy's Hugging Face folder or hub id."
        )
    lines = [line for note in notes for line in textwrap.wrap(note, 110, initial_indent="# ", subsequent_indent="# ")]
    return "\n".join(lines) + "\n" + format_argv(tuple(argv))


def format_argv(argv: tuple[str, ...]) -> str:
    """Shell-quoted argv, one flag (with its values) per line, for scripts and golden files."""
    import shlex

    lines: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return " \\\n  ".join(" ".join(line) for line in lines) + "\n"


def model_args(m: ModelShape) -> list[str]:
    """The model Megatron-LM builds, every layer semantic explicit where its default differs from the model's
    (LayerNorm, biases on, dropout 0.1, learned absolute positions, rotary base 10000, GeLU, tied embeddings)."""
    args = [
        "--num-layers",
        str(m.num_layers),
        "--hidden-size",
        str(m.hidden_size),
        "--ffn-hidden-size",
        str(m.ffn_hidden_size),
        "--num-attention-heads",
        str(m.num_attention_heads),
        "--kv-channels",
        str(m.head_dim),
    ]
    if m.num_query_groups != m.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    args += [
        "--seq-length",
        str(m.seq_length),
        # Megatron-LM asserts max_position_embeddings >= seq_length; RoPE itself has no table of that size.
        "--max-position-embeddings",
        str(max(m.max_position_embeddings, m.seq_length)),
        "--position-embedding-type",
        "rope",
        "--rotary-base",
        str(m.rotary_base),
    ]
    if m.rope_scaling is not None:
        # Megatron's Llama-3.1 scaling fixes the other three values; validate refuses any others.
        args += ["--use-rope-scaling", "--rope-scaling-factor", repr(m.rope_scaling.factor)]
    args += ["--normalization", m.normalization, "--norm-epsilon", repr(m.norm_epsilon)]
    if m.qk_layernorm:
        args.append("--qk-layernorm")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    if m.add_qkv_bias:
        args.append("--add-qkv-bias")
    args += ["--attention-dropout", repr(m.attention_dropout), "--hidden-dropout", repr(m.hidden_dropout)]
    if m.swiglu:
        args.append("--swiglu")
    if not m.tie_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args
