"""Run every rollout policy (and, optionally, static vs adaptive TP generation) over seeds for one layout.

This is what `specdraft rollout simulate` calls; it returns the JSON-ready report and the data the plot needs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from specdraft.errors import UserError
from specdraft.rollout.model import costmodel, trainer
from specdraft.rollout.model.instances import check_rollout, rollout_gpus
from specdraft.rollout.model.profile import ProfileCost, read_csv, valid_tps
from specdraft.rollout.model.workload import (
    DEFAULT_CORRELATION,
    DEFAULT_MEDIAN,
    DEFAULT_SIGMA,
    LengthModel,
    from_file,
    load_history,
    synthetic,
)
from specdraft.rollout.report import metrics
from specdraft.rollout.schedule import dispatch, scheduler, verl
from specdraft.rollout.schedule.adaptive_tp import PlannerConfig, RemainingPredictor
from specdraft.rollout.sim.generation import GenConfig, choose_start, simulate_generation
from specdraft.rollout.sim.simulator import SimConfig, plan_steps, simulate
from specdraft.spec.bounds import MAX_CHECK_EVERY, MIN_CHECK_EVERY
from specdraft.spec.schema import LayoutSpec


@dataclass
class SimulateOptions:
    """Knobs of `specdraft rollout simulate` (CLI flags map 1:1)."""

    seeds: int = 5
    first_seed: int = 0  # seeds first_seed .. first_seed + seeds - 1
    steps: int = 4  # measured RL steps (rounded up to whole periods of lag+1)
    prediction_error: float = 0.2
    lengths: str = "long-tail"  # the preset median, sigma and correlation came from (workload.LENGTH_PRESETS)
    median: float = DEFAULT_MEDIAN
    sigma: float = DEFAULT_SIGMA
    correlation: float = DEFAULT_CORRELATION
    workload: str | None = None
    history: str | None = None
    profile: str | None = None
    policies: tuple = scheduler.POLICIES
    adaptive_tp: bool = False
    tp_overhead_scale: float = 1.0
    tp_predictor: str = "request"
    check_every_steps: int = 64
    tp_start: str = "auto"  # adaptive TP's start: "auto" (generation.choose_start's dry run) or a TP size
    groups_cached: bool = True
    verl_tp: int = verl.VERL_TP  # the verl baseline's static TP (VeRL's rollout default)
    timeline: bool = False


@dataclass
class Report:
    data: dict
    timeline: dict = field(default_factory=dict)
    generation_timeline: list = field(default_factory=list)
    static_timelines: dict = field(default_factory=dict)  # tp -> the static run's timeline (seed 0)
    switches: list = field(default_factory=list)


def cost_model(spec: LayoutSpec, profile: str | None, tps: list[int]):
    """The calibrated cost model, or a measured profile wrapped around it (checked to cover ``tps``)."""
    base = costmodel.from_spec(spec)
    if profile is None:
        return base
    cost = ProfileCost.wrap(base, read_csv(profile))
    cost.require(tps, profile)
    return cost


def _check(opts: SimulateOptions) -> None:
    if opts.seeds < 1:
        raise UserError(f"--seeds {opts.seeds} must be >= 1", "e.g. --seeds 20")
    if opts.steps < 1:
        raise UserError(f"--steps {opts.steps} must be >= 1", "e.g. --steps 4")
    if opts.prediction_error < 0:
        raise UserError(f"--prediction-error {opts.prediction_error} must be >= 0", "0 is an exact predictor")
    if opts.tp_overhead_scale < 0:
        raise UserError(f"--tp-overhead-scale {opts.tp_overhead_scale} must be >= 0", "1 is the modelled overhead")
    if opts.tp_predictor not in ("request", "population"):
        raise UserError(f"--tp-predictor {opts.tp_predictor!r} is not known", "use request or population")
    if opts.tp_start != "auto" and not str(opts.tp_start).isdigit():
        raise UserError(f"--tp-start {opts.tp_start!r} is not auto or a TP size", "e.g. --tp-start auto or 1")
    if not MIN_CHECK_EVERY <= opts.check_every_steps <= MAX_CHECK_EVERY:
        raise UserError(
            f"--check-every {opts.check_every_steps} is outside {MIN_CHECK_EVERY}..{MAX_CHECK_EVERY:,} decode steps "
            "(the planner runs at every check-point; below 16 it costs more and plans the same)",
            "e.g. --check-every 64",
        )
    LengthModel(median=opts.median, sigma=opts.sigma, correlation=opts.correlation).check()


def _verl_layout(spec: LayoutSpec, tp: int) -> LayoutSpec:
    """The layout under VeRL's engine settings at ``tp``; refused (naming --verl-tp) when that TP cannot run it."""
    out = verl.layout(spec, tp)
    errors = check_rollout(out)[0]  # the layout itself passed these rules: VeRL's settings broke them
    if errors:
        raise UserError(
            f"--verl-tp {tp} with VeRL's engine settings: " + "; ".join(p.rule for p in errors),
            "pick another TP for the verl baseline, e.g. --verl-tp 4",
        )
    return out


def run(spec: LayoutSpec, opts: SimulateOptions) -> Report:
    """Simulate every policy over ``opts.seeds`` seeds (and the TP comparison with ``opts.adaptive_tp``)."""
    _check(opts)
    r = spec.rollout
    if not r.enabled:
        raise UserError("the layout's rollout section is disabled", "set rollout.enabled=true")
    tps = valid_tps(spec) if opts.adaptive_tp else [r.tp]
    if opts.adaptive_tp and opts.tp_start != "auto" and int(opts.tp_start) not in tps:
        raise UserError(f"--tp-start {opts.tp_start} is not a TP this layout can use", f"use auto or one of {tps}")
    baseline = _verl_layout(spec, opts.verl_tp) if "verl" in opts.policies or opts.adaptive_tp else None
    cost = cost_model(spec, opts.profile, tps)
    verl_cost = cost_model(baseline, opts.profile, [opts.verl_tp]) if baseline is not None else None
    k, warm = plan_steps(opts.steps, r.max_policy_lag)
    n = r.num_generations_per_prompt
    mb = dispatch.minibatch_prompts(spec.training.global_batch_size, n)
    model = LengthModel(median=opts.median, sigma=opts.sigma, cap=r.max_response_length, correlation=opts.correlation)
    history = load_history(opts.history) if opts.history else None
    # Each policy runs the layout's instances, except verl: VeRL's TP and engine on the same GPUs.
    setups = {
        p: _pipeline(baseline if p == "verl" else spec, verl_cost if p == "verl" else cost, k, warm)
        for p in opts.policies
    }
    runs: dict[str, list] = {p: [] for p in opts.policies}
    gens: dict = {}
    report = Report(data={})
    for seed in range(opts.first_seed, opts.first_seed + opts.seeds):
        steps = k + r.max_policy_lag
        if opts.workload:
            wl = from_file(
                opts.workload,
                steps,
                r.num_prompts_per_step,
                n,
                r.prompt_length,
                r.max_response_length,
                seed,
                opts.prediction_error,
                history,
            )
        else:
            wl = synthetic(model, steps, r.num_prompts_per_step, n, r.prompt_length, seed, opts.prediction_error)
        for policy in opts.policies:
            cfg, hint, train = setups[policy]
            cfg = replace(cfg, timeline=opts.timeline and seed == opts.first_seed and policy == "asp")
            sched = scheduler.build(policy, wl, cfg.num_instances, mb, hint=hint, seed=seed, trainer=train)
            result = simulate(cfg, wl, sched)
            runs[policy].append(result)
            if cfg.timeline:
                report.timeline = result.timeline
        if opts.adaptive_tp:
            _generation(spec, opts, cost, tps, wl[0], seed, gens, report)
            _verl_generation(baseline, verl_cost, wl[0], gens)
    policies = {p: metrics.summarize_policy(v) for p, v in runs.items()}
    report.data = {
        "layout": spec.name,
        "seeds": opts.seeds,
        "measured_steps": k - warm,
        "instances": rollout_gpus(spec) // r.tp,
        "tp": r.tp,
        "colocated": r.colocated,
        "prediction_error": opts.prediction_error,
        "workload": opts.workload
        or {
            "lengths": opts.lengths,
            "median": opts.median,
            "sigma": opts.sigma,
            "cap": r.max_response_length,
            "correlation": opts.correlation,
        },
        "policies": policies,
    }
    if baseline is not None:
        report.data["verl"] = verl.settings(baseline)
    if "fifo" in policies:
        base = policies["fifo"]["iteration_time_s"]["mean"]
        for rec in policies.values():
            rec["vs_fifo"] = metrics.relative(rec["iteration_time_s"]["mean"], base)
    if opts.adaptive_tp:
        report.data["generation"] = _generation_summary(gens, cost, tps, spec, baseline)
    return report


def _pipeline(spec: LayoutSpec, cost, k: int, warm: int) -> tuple:
    """(SimConfig, cost hint, trainer) of the rollout/trainer pipeline on ``spec``'s instances."""
    r = spec.rollout
    train = trainer.from_spec(spec)
    n_inst = rollout_gpus(spec) // r.tp
    typical = r.num_prompts_per_step * r.num_generations_per_prompt // n_inst
    hint = dispatch.hint_from_cost(cost, r.tp, min(cost.max_num_seqs, max(1, typical)))
    cfg = SimConfig(
        cost=cost,
        trainer=train,
        num_instances=n_inst,
        tp=r.tp,
        max_policy_lag=r.max_policy_lag,
        colocated=r.colocated,
        trained_steps=k,
        warmup_steps=warm,
    )
    return cfg, hint, train


def _generation(spec, opts, cost, tps, prompts, seed, gens, report) -> None:
    r, c = spec.rollout, spec.cluster
    nodes = rollout_gpus(spec) // c.gpus_per_node
    for tp in tps:
        static = GenConfig(
            cost=cost,
            gpus_per_node=c.gpus_per_node,
            num_nodes=nodes,
            timeline=opts.timeline and seed == opts.first_seed,
        )
        res = simulate_generation(static, prompts, tp)
        gens.setdefault(str(tp), []).append(res)
        if static.timeline:
            report.static_timelines[tp] = res.timeline
    predictor = RemainingPredictor(
        mode=opts.tp_predictor, sigma=max(opts.prediction_error, 0.05), median=opts.median, cap=r.max_response_length
    )
    planner = PlannerConfig(
        predictor=predictor,
        max_tp=max(tps),
        heads=spec.model.num_attention_heads,
        overhead_scale=opts.tp_overhead_scale,
        groups_cached=opts.groups_cached,
    )
    cfg = GenConfig(
        cost=cost,
        gpus_per_node=c.gpus_per_node,
        num_nodes=nodes,
        planner=planner,
        check_every_steps=opts.check_every_steps,
        timeline=opts.timeline and seed == opts.first_seed,
    )
    if opts.tp_start == "auto":
        start, merges = choose_start(cfg, prompts, tps)
    else:
        start, merges = int(opts.tp_start), True
    res = simulate_generation(cfg if merges else replace(cfg, planner=None), prompts, start)
    res.start_tp = start
    gens.setdefault("adaptive", []).append(res)
    if seed == opts.first_seed:
        report.generation_timeline = res.timeline
        report.switches = res.switches


def _verl_generation(baseline: LayoutSpec, cost, prompts, gens) -> None:
    """The verl baseline generates the same step: VeRL's TP and engine, equal contiguous shares, no switches."""
    c = baseline.cluster
    cfg = GenConfig(
        cost=cost, gpus_per_node=c.gpus_per_node, num_nodes=rollout_gpus(baseline) // c.gpus_per_node, dispatch="even"
    )
    gens.setdefault("verl", []).append(simulate_generation(cfg, prompts, baseline.rollout.tp))


def _generation_summary(gens: dict, cost, tps: list[int], spec: LayoutSpec, baseline: LayoutSpec) -> dict:
    def makespans(key):
        return metrics.spread([g.makespan_s for g in gens[key]])

    static = {tp: {"makespan_s": makespans(tp)} for tp in map(str, tps)}
    best = min(static, key=lambda tp: static[tp]["makespan_s"]["mean"])
    adaptive = gens["adaptive"]
    mk = makespans("adaptive")
    starts = sorted({g.start_tp for g in adaptive})
    ctx = spec.rollout.prompt_length + min(spec.rollout.max_response_length, 4096)
    verl_mk = makespans("verl")
    per_seed = {
        "verl": [a.makespan_s / v.makespan_s for a, v in zip(adaptive, gens["verl"])],
        "best_static": [a.makespan_s / s.makespan_s for a, s in zip(adaptive, gens[best])],
    }
    return {
        "static": static,
        "best_static_tp": {"tp": int(best), "makespan_s": static[best]["makespan_s"]},
        "verl": {**verl.settings(baseline), "makespan_s": verl_mk},
        "layout_tp": spec.rollout.tp,
        "adaptive": {
            "start_tp": starts[0] if len(starts) == 1 else starts,
            "makespan_s": mk,
            # Ratios of mean makespans (what the targets compare); per seed, the mean ratio with its 95% CI and the
            # worst seed's ratio.
            "x_verl": mk["mean"] / verl_mk["mean"],
            "x_best_static": mk["mean"] / static[best]["makespan_s"]["mean"],
            "x_per_seed": {key: metrics.mean_ci(v) for key, v in per_seed.items()},
            "worst_seed_x": {key: max(v) for key, v in per_seed.items()},
            "vs_best_static": metrics.relative(mk["mean"], static[best]["makespan_s"]["mean"]),
            "vs_layout_tp": metrics.relative(mk["mean"], static[str(spec.rollout.tp)]["makespan_s"]["mean"]),
            "switches_per_run": statistics.fmean(len(g.switches) for g in adaptive),
            "overhead_s": statistics.fmean(g.overhead_s for g in adaptive),
            "switches": adaptive[0].switches,
        },
        # Largest batch at which speculation still raises tokens/s, per TP, at a typical context.
        "speculation_below_batch": {str(tp): cost.speculation_threshold(tp, ctx) for tp in tps},
    }
