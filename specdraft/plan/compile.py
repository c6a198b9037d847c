"""compile(spec) -> LaunchPlan: pure and deterministic. Validation (field rules + memory) runs first."""

from __future__ import annotations

from specdraft import __version__
from specdraft.errors import Problem, SpecError
from specdraft.plan.grid import RankGrid, Sizes
from specdraft.plan.memory import draft_params, stage_memory
from specdraft.plan.model import SCHEMA_VERSION, LaunchPlan
from specdraft.plan.stages import layer_owner, stage_records
from specdraft.plan.taps import (aux_layers, draft_stage_index, pipeline_activation_bytes_per_step, tap_routes)
from specdraft.spec.load import spec_sha256, spec_to_dict
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate import pad_multiple, resolved_dp, stage_layer_counts, validate_fields, world_size

CP_ATTENTION_MODE = "zigzag_ring_branch_merge"


def sizes_of(spec: LayoutSpec) -> Sizes:
    p = spec.parallel
    world = world_size(spec)
    dp = resolved_dp(spec) or 1
    etp = p.etp or p.tp
    return Sizes(world_size=world, tp=p.tp, cp=p.cp, pp=p.pp, dp=dp, ep=p.ep, etp=etp,
                 edp=max(world // (etp * p.ep * p.pp), 1), vpp=p.vpp if p.vpp and p.vpp > 1 else None, order=p.order)


def num_microbatches(spec: LayoutSpec, dp: int) -> int:
    t = spec.training
    return max(t.global_batch_size // (t.micro_batch_size * dp), 1)


def draft_slots(spec: LayoutSpec, m: int) -> int:
    """Landing slots the draft stage needs: taps of the microbatches in flight between source and draft stage.

    On the last stage the draft runs inside the loss of each microbatch, so at most pp microbatches are in
    flight (1F1B warm-up depth); elsewhere the draft runs after the schedule and holds every microbatch.
    """
    p = spec.parallel
    return min(p.pp, m) if draft_stage_index(spec) == p.pp - 1 else m


def padding_report(spec: LayoutSpec) -> dict:
    """Packing overhead of padding each sequence to a multiple of 2*cp (times tp with sequence parallelism)."""
    multiple = pad_multiple(spec)
    lengths = spec.training.sequence_lengths or [spec.model.seq_length]
    padded = [-(-n // multiple) * multiple for n in lengths]
    real = sum(lengths)
    return {
        "pad_multiple": multiple,
        "sequence_lengths": lengths,
        "padded_lengths": padded,
        "padding_overhead": round((sum(padded) - real) / real, 6) if real else 0.0,
        # Over uniformly distributed lengths a sequence pads (multiple - 1) / 2 tokens on average.
        "expected_pad_tokens_per_sequence": (multiple - 1) / 2,
    }


def check(spec: LayoutSpec) -> tuple[list[Problem], list[Problem]]:
    """Every error and warning of a layout: field rules, then (when those pass) memory per stage."""
    errors, warnings = validate_fields(spec)
    from specdraft.rollout.instances import check_rollout  # pure Python; kept next to the rollout planner

    r_errors, r_warnings = check_rollout(spec)
    errors, warnings = errors + r_errors, warnings + r_warnings
    if errors:
        return errors, warnings
    sizes = sizes_of(spec)
    m = num_microbatches(spec, sizes.dp)
    draft_stage = draft_stage_index(spec) if spec.draft.enabled else None
    memory = stage_memory(spec, stage_layer_counts(spec), sizes.dp, sizes.edp, m, draft_stage,
                          draft_slots(spec, m))
    for stage in memory:
        gib = stage["total"] / 2**30
        cap = stage["hbm"] / 2**30
        where = f"memory.stage[{stage['pp']}]"
        if stage["fraction"] > 1.0:
            errors.append(Problem(path=where, value=f"{gib:.1f} GiB", rule=f"exceeds the {spec.cluster.gpu} HBM "
                                  f"({cap:.1f} GiB) on pipeline stage {stage['pp']}",
                                  fix=_memory_fix(spec, stage)))
        elif stage["fraction"] > 0.9:
            warnings.append(Problem(path=where, value=f"{gib:.1f} GiB", rule=f"uses {stage['fraction']:.0%} of "
                                    f"the {spec.cluster.gpu} HBM ({cap:.1f} GiB)", fix=_memory_fix(spec, stage),
                                    severity="warning"))
    return errors, warnings


def _memory_fix(spec: LayoutSpec, stage: dict) -> str:
    t, p = spec.training, spec.parallel
    hints = []
    if stage["draft"] > 0.25 * stage["total"]:
        hints.append("move layers off the draft's stage (`specdraft plan --balance` finds the split, or set "
                     "parallel.first_stage_layers/last_stage_layers), or put the draft elsewhere (draft.stage)")
    if not t.distributed_optimizer:
        hints.append("training.distributed_optimizer=true")
    if t.recompute != "full":
        hints.append("training.recompute=full")
    hints.append(f"raise parallel.pp (now {p.pp}) or parallel.tp (now {p.tp})")
    return "try " + "; ".join(hints)


def compile(spec: LayoutSpec) -> LaunchPlan:  # noqa: A001 - the name the design uses
    """Validate and compile ``spec``; raise SpecError listing every problem."""
    errors, warnings = check(spec)
    if errors:
        raise SpecError(errors)
    sizes = sizes_of(spec)
    grid = RankGrid(sizes=sizes, gpus_per_node=spec.cluster.gpus_per_node)
    m = num_microbatches(spec, sizes.dp)
    counts = stage_layer_counts(spec)
    owner = layer_owner(spec)
    d = spec.draft
    draft_stage = draft_stage_index(spec) if d.enabled else None
    memory = stage_memory(spec, counts, sizes.dp, sizes.edp, m, draft_stage, draft_slots(spec, m))
    routes, taps = tap_routes(spec, grid, owner) if d.enabled else ([], [])
    transport = sum(r["bytes_per_microbatch"] for r in routes if not r["local"]) * m
    draft = {
        "enabled": d.enabled,
        "stage": draft_stage,
        "ranks": grid.stage_ranks(draft_stage) if d.enabled else [],
        "aux_layers": aux_layers(spec) if d.enabled else [],
        "ttt_steps": d.ttt_steps,
        "cp_attention": CP_ATTENTION_MODE if d.enabled and spec.parallel.cp > 1 else "off",
        "num_params": draft_params(spec) if d.enabled else 0,
        "memory_bytes": memory[draft_stage]["draft"] if d.enabled else 0,
        "landing_slots": draft_slots(spec, m) if d.enabled else 0,
        "padding": padding_report(spec) if d.enabled and spec.parallel.cp > 1 else None,
    }
    parallel = {
        "tp": sizes.tp, "cp": sizes.cp, "pp": sizes.pp, "dp": sizes.dp, "ep": sizes.ep, "etp": sizes.etp,
        "edp": sizes.edp, "vpp": sizes.vpp, "order": sizes.order,
        "sequence_parallel": spec.parallel.sequence_parallel, "cp_comm_type": spec.parallel.cp_comm_type,
    }
    core = dict(
        schema_version=SCHEMA_VERSION,
        specdraft_version=__version__,
        name=spec.name,
        spec_sha256=spec_sha256(spec),
        spec=spec_to_dict(spec),
        world_size=sizes.world_size,
        parallel=parallel,
        num_microbatches=m,
        ranks=grid.ranks(),
        stages=stage_records(spec),
        memory=memory,
        draft=draft,
        taps=[{**t, "bytes_per_step": 0 if t["local"] else t["bytes_per_microbatch"] * t["num_routes"] * m}
              for t in taps],
        tap_routes=routes,
        tap_traffic={
            "bytes_per_step": transport,
            "cross_node_bytes_per_step": sum(r["bytes_per_microbatch"] for r in routes
                                             if r["cross_node"] and not r["local"]) * m,
            "pipeline_activation_bytes_per_step": pipeline_activation_bytes_per_step(spec, grid, m),
        },
        warnings=[w.to_dict() for w in warnings],
    )
    from specdraft.render.megatron import megatron_argv
    from specdraft.render.nemo_rl import nemo_rl_overrides
    from specdraft.render.vllm import vllm_settings
    from specdraft.rollout.instances import plan_rollout

    rollout = plan_rollout(spec, core)
    megatron = megatron_argv(spec, core)
    renders = {"megatron": megatron, "nemo_rl": nemo_rl_overrides(spec, core), "vllm": vllm_settings(spec, core)}
    return LaunchPlan(megatron_args=megatron, renders=renders, rollout=rollout, **core)
