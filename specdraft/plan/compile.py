"""compile_core(spec) -> LaunchPlan without renders: pure and deterministic. Validation (field rules + memory) first.

`specdraft.assemble.compile` adds the renders and the rollout plan; everyone else calls that. `one_process_plan`
is the same compile of a plan's spec at one rank, for the offline tools that load whole models.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdraft import __version__
from specdraft.errors import Problem, SpecError
from specdraft.plan.dims import ParallelDims
from specdraft.plan.grid import RankGrid
from specdraft.plan.grpo import grpo_plan
from specdraft.plan.memory import draft_params, stage_memory
from specdraft.plan.model import (
    SCHEMA_VERSION,
    DataPlan,
    DraftPlan,
    LaunchPlan,
    ModelShape,
    PaddingReport,
    PlanWarning,
    StageMemory,
    TapTraffic,
)
from specdraft.plan.settings import ClusterPlan, RolloutSettings, SlurmPlan, TrainingPlan
from specdraft.plan.stages import layer_owner, stage_records
from specdraft.plan.taps import pipeline_activation_bytes_per_step, tap_routes
from specdraft.spec import derived
from specdraft.spec.load import spec_sha256
from specdraft.spec.schema import LayoutSpec, ParallelSpec
from specdraft.spec.validate import validate_fields
from specdraft.spec.validate.parallel import stage_layer_counts

CP_ATTENTION_MODE = "zigzag_ring_branch_merge"


def parallel_dims(spec: LayoutSpec) -> ParallelDims:
    """The resolved sizes of a layout that passed the field rules: the one place the spec's sizes are read."""
    p, t = spec.parallel, spec.training
    return ParallelDims.resolve(
        world_size=derived.world_size(spec),
        tp=p.tp,
        cp=p.cp,
        pp=p.pp,
        dp=derived.resolved_dp(spec) or 1,
        ep=p.ep,
        etp=derived.etp(p),
        vpp=derived.vpp(p),
        order=p.order,
        sequence_parallel=p.sequence_parallel,
        cp_comm_type=p.cp_comm_type,
        hierarchical_cp_sizes=tuple(p.hierarchical_cp_sizes) if p.hierarchical_cp_sizes is not None else None,
        micro_batch_size=t.micro_batch_size,
        global_batch_size=t.global_batch_size,
        first_stage_layers=p.first_stage_layers,
        last_stage_layers=p.last_stage_layers,
        account_for_embedding_in_pipeline_split=p.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=p.account_for_loss_in_pipeline_split,
    )


def model_shape(spec: LayoutSpec) -> ModelShape:
    """The resolved model section: every null and default of spec.model made explicit."""
    m = spec.model
    return ModelShape(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=derived.kv_heads(m),
        head_dim=derived.head_dim(m),
        kv_channels=m.kv_channels,
        vocab_size=m.vocab_size,
        seq_length=m.seq_length,
        max_position_embeddings=m.max_position_embeddings if m.max_position_embeddings is not None else m.seq_length,
        num_experts=m.num_experts,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size,
        moe_router_topk=m.moe_router_topk,
        moe_aux_loss_coeff=m.moe_aux_loss_coeff,
        swiglu=m.swiglu,
        normalization=m.normalization,
        norm_epsilon=m.norm_epsilon,
        add_bias_linear=m.add_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        attention_dropout=m.attention_dropout,
        hidden_dropout=m.hidden_dropout,
        rotary_base=m.rotary_base,
        rope_scaling=m.rope_scaling,
        qk_layernorm=m.qk_layernorm,
        tie_embeddings=m.tie_embeddings,
        path=m.path,
        config_sha256=m.config_sha256,
        config_fields=tuple(m.config_fields),
    )


def data_plan(spec: LayoutSpec) -> DataPlan:
    """The data section resolved: the file (and the tokenizer folder) or the Markov chain, the seed, the multiple."""
    d, t = spec.data, spec.training
    return DataPlan(
        path=d.path,
        format=d.format,
        tokenizer=spec.model.path if d.path is not None else None,
        shuffle=d.shuffle,
        seed=d.seed if d.path is not None and d.seed is not None else t.seed,
        length_multiple=derived.length_multiple(spec.parallel),
        drift_interval=t.data_drift_interval,
        drift_fraction=t.data_drift_fraction,
    )


def cluster_plan(spec: LayoutSpec) -> ClusterPlan:
    c = spec.cluster
    return ClusterPlan(num_nodes=c.num_nodes, gpus_per_node=c.gpus_per_node, gpu=c.gpu, executor=c.executor)


def training_plan(spec: LayoutSpec) -> TrainingPlan:
    t = spec.training
    return TrainingPlan(
        packing=t.packing,
        sequence_lengths=tuple(t.sequence_lengths or [spec.model.seq_length]),
        dtype=t.dtype,
        grad_reduce_in_bf16=t.grad_reduce_in_bf16,
        tp_comm_overlap=derived.tp_comm_overlap(spec, spec.parallel.tp, bool(spec.parallel.sequence_parallel)),
        distributed_optimizer=t.distributed_optimizer,
        recompute=t.recompute,
        train_iters=t.train_iters,
        warmup_steps=t.warmup_steps,
        lr=t.lr,
        clip_grad=t.clip_grad,
        seed=t.seed,
        save_interval=t.save_interval,
        keep_checkpoints=t.keep_checkpoints,
        stop_grace_s=t.stop_grace_s,
    )


def slurm_plan(spec: LayoutSpec) -> SlurmPlan:
    s = spec.slurm
    limit = derived.slurm_time_seconds(s.time)
    return SlurmPlan(
        time_limit_s=limit,
        signal_delay_s=derived.signal_delay_s(limit),
        time=s.time,
        partition=s.partition,
        account=s.account,
        qos=s.qos,
        cpus_per_task=s.cpus_per_task,
        mem=s.mem,
        container_image=s.container_image,
        container_mounts=tuple(s.container_mounts),
        container_specdraft=s.container_specdraft if s.container_image else None,
        env=dict(s.env),
        extra_sbatch_args=tuple(s.extra_sbatch_args),
        max_requeues=s.max_requeues,
    )


def rollout_settings(spec: LayoutSpec) -> RolloutSettings:
    r = spec.rollout
    return RolloutSettings(
        tp=r.tp,
        colocated=r.colocated,
        num_nodes=0 if r.colocated else r.num_nodes,
        num_gpus=derived.rollout_gpus(spec),
        speculative=r.speculative,
        num_speculative_tokens=derived.num_speculative_tokens(spec),
        gpu_memory_utilization=r.gpu_memory_utilization,
        max_model_len=derived.max_model_len(spec),
        max_response_length=r.max_response_length,
        max_num_seqs=r.max_num_seqs,
        max_policy_lag=r.max_policy_lag,
        num_prompts_per_step=r.num_prompts_per_step,
        num_generations_per_prompt=r.num_generations_per_prompt,
        schedule=r.schedule,
    )


def draft_slots(dims: ParallelDims, draft_stage: int) -> int:
    """Landing slots the draft stage needs: taps of the microbatches in flight between source and draft stage.

    On the last stage the draft runs inside the loss of each microbatch, so at most pp microbatches are in
    flight (1F1B warm-up depth); elsewhere the draft runs after the schedule and holds every microbatch.
    """
    m = dims.num_microbatches
    return min(dims.pp, m) if draft_stage == dims.last_stage else m


def padding_report(spec: LayoutSpec, dims: ParallelDims) -> PaddingReport:
    """Packing overhead of padding each sequence to a multiple of 2*cp (times tp with sequence parallelism)."""
    multiple = dims.pad_multiple
    lengths = spec.training.sequence_lengths or [spec.model.seq_length]
    padded = [-(-n // multiple) * multiple for n in lengths]
    real = sum(lengths)
    return PaddingReport(
        pad_multiple=multiple,
        sequence_lengths=tuple(lengths),
        padded_lengths=tuple(padded),
        padding_overhead=round((sum(padded) - real) / real, 6) if real else 0.0,
        # Over uniformly distributed lengths a sequence pads (multiple - 1) / 2 tokens on average.
        expected_pad_tokens_per_sequence=(multiple - 1) / 2,
    )


def plan_memory(spec: LayoutSpec, dims: ParallelDims | None = None) -> tuple[StageMemory, ...]:
    """Memory per stage of a layout that passed the field rules (the draft on its stage)."""
    dims = dims or parallel_dims(spec)
    draft_stage = derived.draft_stage_index(spec) if spec.draft.enabled else None
    slots = draft_slots(dims, draft_stage) if draft_stage is not None else 0
    return stage_memory(spec, dims, stage_layer_counts(spec), draft_stage, slots)


def _analyse(
    spec: LayoutSpec,
) -> tuple[list[Problem], list[Problem], ParallelDims | None, tuple[StageMemory, ...] | None]:
    errors, warnings = validate_fields(spec)
    if errors:
        return errors, warnings, None, None
    dims = parallel_dims(spec)
    memory = plan_memory(spec, dims)
    for stage in memory:
        gib = stage.total / 2**30
        cap = stage.hbm / 2**30
        where = f"memory.stage[{stage.pp}]"
        if stage.fraction > 1.0:
            errors.append(
                Problem(
                    path=where,
                    value=f"{gib:.1f} GiB",
                    rule=f"exceeds the {spec.cluster.gpu} HBM ({cap:.1f} GiB) on pipeline stage {stage.pp}",
                    fix=_memory_fix(spec, stage),
                )
            )
        elif stage.fraction > 0.9:
            warnings.append(
                Problem(
                    path=where,
                    value=f"{gib:.1f} GiB",
                    rule=f"uses {stage.fraction:.0%} of the {spec.cluster.gpu} HBM ({cap:.1f} GiB)",
                    fix=_memory_fix(spec, stage),
                    severity="warning",
                )
            )
    return errors, warnings, dims, memory


def check(spec: LayoutSpec) -> tuple[list[Problem], list[Problem]]:
    """Every error and warning of the training layout: field rules, then (when those pass) memory per stage."""
    errors, warnings, _, _ = _analyse(spec)
    return errors, warnings


def _memory_fix(spec: LayoutSpec, stage: StageMemory) -> str:
    t, p = spec.training, spec.parallel
    hints = []
    if stage.draft > 0.25 * stage.total:
        hints.append(
            "move layers off the draft's stage (`specdraft plan --balance` finds the split, or set "
            "parallel.first_stage_layers/last_stage_layers), or put the draft elsewhere (draft.stage)"
        )
    if not t.distributed_optimizer:
        hints.append("training.distributed_optimizer=true")
    if t.recompute != "full":
        hints.append("training.recompute=full")
    hints.append(f"raise parallel.pp (now {p.pp}) or parallel.tp (now {p.tp})")
    return "try " + "; ".join(hints)


def compile_core(spec: LayoutSpec, extra_errors: list[Problem] = (), extra_warnings: list[Problem] = ()) -> LaunchPlan:
    """Validate and compile ``spec`` into a plan without renders or rollout; raise SpecError listing every problem.

    ``extra_errors`` / ``extra_warnings`` come from the layers above (the rollout rules), so one pass reports all.
    """
    errors, warnings, dims, memory = _analyse(spec)
    errors = [*errors, *extra_errors]
    if errors or dims is None or memory is None:  # the field rules passed exactly when dims and memory are set
        raise SpecError(errors)
    return _build(spec, dims, memory, [*warnings, *extra_warnings])


def one_process_plan(plan: LaunchPlan) -> LaunchPlan:
    """``plan``'s model and draft on one process: its spec compiled at tp = cp = pp = dp = ep = 1 on one GPU, one
    stage holding every layer and the draft. The offline tools (export, measure) build unsharded models from it;
    the memory rule is left out, since a whole model loads wherever the tool runs, not on one GPU of the layout."""
    spec = plan.spec
    one = dataclasses.replace(
        spec,
        cluster=dataclasses.replace(spec.cluster, num_nodes=1, gpus_per_node=1),
        parallel=ParallelSpec(order=spec.parallel.order),
        draft=dataclasses.replace(spec.draft, stage="last"),
    )
    errors, warnings = validate_fields(one)
    if errors:
        raise SpecError(errors, "the one-process variant of the plan's spec")
    dims = parallel_dims(one)
    return _build(one, dims, plan_memory(one, dims), warnings)


def _build(
    spec: LayoutSpec, dims: ParallelDims, memory: tuple[StageMemory, ...], warnings: list[Problem]
) -> LaunchPlan:
    """The plan of a validated ``spec`` with its resolved ``dims``: the one constructor of LaunchPlan."""
    grid = RankGrid(sizes=dims, gpus_per_node=spec.cluster.gpus_per_node)
    m = dims.num_microbatches
    d = spec.draft
    num_layers = spec.model.num_layers
    if d.enabled:
        draft_stage = derived.draft_stage_index(spec)
        routes, taps = tap_routes(spec, grid, layer_owner(num_layers, dims), draft_stage)
        placement: dict[str, Any] = dict(
            enabled=True,
            stage=draft_stage,
            ranks=tuple(grid.stage_ranks(draft_stage)),
            aux_layers=tuple(derived.aux_layers(spec)),
            cp_attention=CP_ATTENTION_MODE if dims.cp > 1 else "off",
            num_params=draft_params(spec),
            memory_bytes=memory[draft_stage].draft,
            landing_slots=draft_slots(dims, draft_stage),
            padding=padding_report(spec, dims) if dims.cp > 1 else None,
        )
    else:
        routes, taps = (), ()
        placement = dict(
            enabled=False,
            stage=None,
            ranks=(),
            aux_layers=(),
            cp_attention="off",
            num_params=0,
            memory_bytes=0,
            landing_slots=0,
            padding=None,
        )
    draft = DraftPlan(
        **placement,
        method=d.method,
        num_layers=d.num_layers,
        ttt_steps=d.ttt_steps,
        vocab_size=derived.draft_vocab_size(spec),
        loss_weight=d.loss_weight,
        lr=d.lr,
        lr_warmup_steps=derived.draft_lr_warmup_steps(spec),
        clip_grad=d.clip_grad,
        model=d.model,
        export_interval=d.export_interval,
        path=d.path,
        norm_before_residual=d.norm_before_residual,
        norm_output=d.norm_output,
        refit_interval=d.refit_interval,
        refit_policy=d.refit_policy,
        refit_drift_margin=d.refit_drift_margin,
    )
    return LaunchPlan(
        schema_version=SCHEMA_VERSION,
        specdraft_version=__version__,
        name=spec.name,
        workload=spec.workload,
        spec_sha256=spec_sha256(spec),
        spec=spec,
        model=model_shape(spec),
        cluster=cluster_plan(spec),
        parallel=dims,
        training=training_plan(spec),
        slurm=slurm_plan(spec),
        data=data_plan(spec),
        ranks=grid.ranks(),
        stages=stage_records(num_layers, dims),
        memory=memory,
        draft=draft,
        taps=taps,
        tap_routes=routes,
        tap_traffic=TapTraffic(
            bytes_per_step=sum(r.bytes_per_microbatch for r in routes if not r.local) * m,
            cross_node_bytes_per_step=sum(r.bytes_per_microbatch for r in routes if r.cross_node and not r.local) * m,
            pipeline_activation_bytes_per_step=pipeline_activation_bytes_per_step(spec, grid),
        ),
        warnings=tuple(PlanWarning(**w.to_dict()) for w in warnings),
        rollout_settings=rollout_settings(spec),
        grpo=grpo_plan(spec),
        renders=None,
        rollout=None,
    )
