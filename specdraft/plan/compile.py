"""compile_core(spec) -> LaunchPlan without renders: pure and deterministic. Validation (field rules + memory) first.

`specdraft.assemble.compile` adds the renders and the rollout plan; everyone else calls that.
"""

from __future__ import annotations

from specdraft import __version__
from specdraft.errors import Problem, SpecError
from specdraft.plan.grid import RankGrid
from specdraft.plan.memory import draft_params, stage_memory
from specdraft.plan.model import (
    SCHEMA_VERSION,
    DataPlan,
    DraftPlan,
    LaunchPlan,
    ModelShape,
    PaddingReport,
    ParallelPlan,
    PlanWarning,
    SlurmPlan,
    StageMemory,
    TapTraffic,
)
from specdraft.plan.stages import layer_owner, stage_records
from specdraft.plan.taps import pipeline_activation_bytes_per_step, tap_routes
from specdraft.spec import derived
from specdraft.spec.load import spec_sha256
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate import stage_layer_counts, validate_fields

CP_ATTENTION_MODE = "zigzag_ring_branch_merge"


def parallel_plan(spec: LayoutSpec) -> ParallelPlan:
    """The resolved sizes of a layout that passed the field rules."""
    p = spec.parallel
    return ParallelPlan(
        tp=p.tp,
        cp=p.cp,
        pp=p.pp,
        dp=derived.resolved_dp(spec) or 1,
        ep=p.ep,
        etp=derived.etp(p),
        edp=derived.edp(spec),
        vpp=derived.vpp(p),
        order=p.order,
        sequence_parallel=p.sequence_parallel,
        cp_comm_type=p.cp_comm_type,
        hierarchical_cp_sizes=tuple(p.hierarchical_cp_sizes) if p.hierarchical_cp_sizes is not None else None,
        pad_multiple=derived.pad_multiple(p),
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


def num_microbatches(spec: LayoutSpec, dp: int) -> int:
    t = spec.training
    return max(t.global_batch_size // (t.micro_batch_size * dp), 1)


def draft_slots(spec: LayoutSpec, m: int) -> int:
    """Landing slots the draft stage needs: taps of the microbatches in flight between source and draft stage.

    On the last stage the draft runs inside the loss of each microbatch, so at most pp microbatches are in
    flight (1F1B warm-up depth); elsewhere the draft runs after the schedule and holds every microbatch.
    """
    p = spec.parallel
    return min(p.pp, m) if derived.draft_stage_index(spec) == p.pp - 1 else m


def padding_report(spec: LayoutSpec) -> PaddingReport:
    """Packing overhead of padding each sequence to a multiple of 2*cp (times tp with sequence parallelism)."""
    multiple = derived.pad_multiple(spec.parallel)
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


def plan_memory(spec: LayoutSpec) -> tuple[StageMemory, ...]:
    """Memory per stage of a layout that passed the field rules (the draft on its stage)."""
    parallel = parallel_plan(spec)
    m = num_microbatches(spec, parallel.dp)
    draft_stage = derived.draft_stage_index(spec) if spec.draft.enabled else None
    return stage_memory(spec, stage_layer_counts(spec), parallel.dp, parallel.edp, m, draft_stage, draft_slots(spec, m))


def _analyse(spec: LayoutSpec) -> tuple[list[Problem], list[Problem], tuple[StageMemory, ...] | None]:
    errors, warnings = validate_fields(spec)
    if errors:
        return errors, warnings, None
    memory = plan_memory(spec)
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
    return errors, warnings, memory


def check(spec: LayoutSpec) -> tuple[list[Problem], list[Problem]]:
    """Every error and warning of the training layout: field rules, then (when those pass) memory per stage."""
    errors, warnings, _ = _analyse(spec)
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
    errors, warnings, memory = _analyse(spec)
    errors = [*errors, *extra_errors]
    if errors:
        raise SpecError(errors)
    parallel = parallel_plan(spec)
    world = derived.world_size(spec)
    grid = RankGrid(sizes=parallel, world_size=world, gpus_per_node=spec.cluster.gpus_per_node)
    m = num_microbatches(spec, parallel.dp)
    d = spec.draft
    if d.enabled:
        draft_stage = derived.draft_stage_index(spec)
        routes, taps = tap_routes(spec, grid, layer_owner(spec), m)
        draft = DraftPlan(
            enabled=True,
            stage=draft_stage,
            ranks=tuple(grid.stage_ranks(draft_stage)),
            aux_layers=tuple(derived.aux_layers(spec)),
            cp_attention=CP_ATTENTION_MODE if parallel.cp > 1 else "off",
            num_params=draft_params(spec),
            memory_bytes=memory[draft_stage].draft,
            landing_slots=draft_slots(spec, m),
            padding=padding_report(spec) if parallel.cp > 1 else None,
        )
    else:
        routes, taps = (), ()
        draft = DraftPlan(
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
    limit = derived.slurm_time_seconds(spec.slurm.time)
    return LaunchPlan(
        schema_version=SCHEMA_VERSION,
        specdraft_version=__version__,
        name=spec.name,
        spec_sha256=spec_sha256(spec),
        spec=spec,
        model=model_shape(spec),
        world_size=world,
        parallel=parallel,
        slurm=SlurmPlan(time_limit_s=limit, signal_delay_s=derived.signal_delay_s(limit)),
        num_microbatches=m,
        data=data_plan(spec),
        ranks=grid.ranks(),
        stages=stage_records(spec),
        memory=memory,
        draft=draft,
        taps=taps,
        tap_routes=routes,
        tap_traffic=TapTraffic(
            bytes_per_step=sum(r.bytes_per_microbatch for r in routes if not r.local) * m,
            cross_node_bytes_per_step=sum(r.bytes_per_microbatch for r in routes if r.cross_node and not r.local) * m,
            pipeline_activation_bytes_per_step=pipeline_activation_bytes_per_step(spec, grid, m),
        ),
        warnings=tuple(PlanWarning(**w.to_dict()) for w in [*warnings, *extra_warnings]),
        renders=None,
        rollout=None,
    )
