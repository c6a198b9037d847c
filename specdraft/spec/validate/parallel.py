"""Parallelism rules of a layout: the tp/cp/pp/dp/ep sizes against the world and the model, the rank order, and
how the layers split over pipeline stages. Called by validate.validate_fields with its `err` and `warn` collectors."""

from __future__ import annotations

import functools
import math

from specdraft.errors import Problem
from specdraft.spec.accounting import accounted_split_rules, layer_counts, split_accounting
from specdraft.spec.derived import etp, kv_heads, pad_multiple, world_size
from specdraft.spec.schema import LayoutSpec


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n`` in increasing order ([] for n < 1), from its prime factorisation.

    Trial division over 1..n cost O(n) per call, and search calls this for every base with the global batch (up
    to 2**24): factorising costs O(sqrt n) once, and the cache makes every repeat a copy.
    """
    return list(_divisors(n)) if n > 0 else []


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    out = [1]
    rest, p = n, 2
    while p * p <= rest:
        if rest % p == 0:
            power, powers = 1, []
            while rest % p == 0:
                rest //= p
                power *= p
                powers.append(power)
            out += [d * q for d in out for q in powers]
        p += 1 if p == 2 else 2
    if rest > 1:  # one prime factor above sqrt(n) is left
        out += [d * rest for d in out]
    return tuple(sorted(out))


SP_HINT_TP = 4  # the tp from which NVIDIA's published recipes use sequence parallelism


def parallel_rules(spec: LayoutSpec, err, warn) -> None:
    m, c, p = spec.model, spec.cluster, spec.parallel
    world = world_size(spec)
    sizes_ok = True
    for fname in ("tp", "cp", "pp", "ep"):
        if getattr(p, fname) < 1:
            err(f"parallel.{fname}", getattr(p, fname), "must be >= 1", "use 1 to disable this dimension")
            sizes_ok = False
    if p.dp == 0 or p.dp < -1:
        err("parallel.dp", p.dp, "must be >= 1, or -1 to derive it", "use -1")
        sizes_ok = False
    heads, groups = m.num_attention_heads, kv_heads(m)
    if p.tp >= 1:  # rules of tp alone, reported even when another size is invalid
        if heads >= 1 and groups >= 1 and (heads % p.tp or groups % p.tp):
            err(
                "parallel.tp",
                p.tp,
                f"must divide model.num_attention_heads ({heads}) and num_query_groups ({groups})",
                f"use one of {', '.join(map(str, divisors(math.gcd(heads, groups))))}",
            )
        if p.tp > c.gpus_per_node >= 1:
            warn(
                "parallel.tp",
                p.tp,
                f"tensor parallelism spans nodes (gpus_per_node = {c.gpus_per_node}); "
                "its all-reduces cross the inter-node network",
                f"keep tp <= {c.gpus_per_node}",
            )
        if p.sequence_parallel and p.tp == 1:
            err("parallel.sequence_parallel", True, "needs tp > 1", "set parallel.sequence_parallel=false or raise tp")
        if p.tp >= SP_HINT_TP and not p.sequence_parallel:
            # Megatron-Bridge's Llama-3 recipes (recipes/llama/h100/llama3.py) run TP4 and TP8 with it on.
            warn(
                "parallel.sequence_parallel",
                False,
                f"off at tp = {p.tp}: each tp rank then holds the layer norms' and dropouts' activations whole, "
                f"and NVIDIA's recipes turn sequence parallelism on from tp {SP_HINT_TP}",
                "set parallel.sequence_parallel=true (model.seq_length must then be a multiple of 2*cp*tp)",
            )
    if not sizes_ok or world < 1:
        return
    inner = p.tp * p.cp * p.pp
    if p.dp == -1 and world % inner:
        err(
            "parallel",
            f"tp*cp*pp = {p.tp}*{p.cp}*{p.pp} = {inner}",
            f"must divide the world size (cluster.num_nodes * gpus_per_node = {world})",
            f"use a world size that is a multiple of {inner}, e.g. cluster.num_nodes = "
            f"{max(1, math.ceil(inner / c.gpus_per_node))} with {c.gpus_per_node} GPUs per node, or change tp/cp/pp",
        )
    elif p.dp != -1 and inner * p.dp != world:
        err(
            "parallel.dp",
            p.dp,
            f"tp*cp*pp*dp = {inner * p.dp} must equal the world size ({world})",
            f"use parallel.dp=-1 (derives {world // inner})"
            if world % inner == 0
            else f"set cluster.num_nodes to {math.ceil(inner * p.dp / c.gpus_per_node)}",
        )

    _layer_split_rules(spec, err)

    seq_mult = pad_multiple(p.cp, p.tp, p.sequence_parallel)
    if p.cp > 1 or p.sequence_parallel:
        if m.seq_length % seq_mult:
            what = f"2*cp{'*tp' if p.sequence_parallel else ''} = {seq_mult}"
            err(
                "model.seq_length",
                m.seq_length,
                f"must be a multiple of {what} (zigzag context-parallel chunks)",
                f"use {m.seq_length // seq_mult * seq_mult or seq_mult} or {(m.seq_length // seq_mult + 1) * seq_mult}",
            )
    if p.cp_comm_type == "a2a+p2p":
        sizes = p.hierarchical_cp_sizes
        if not sizes or math.prod(sizes) != p.cp:
            err(
                "parallel.hierarchical_cp_sizes",
                sizes,
                f"a2a+p2p needs sizes whose product is cp ({p.cp})",
                f"e.g. [{2 if p.cp % 2 == 0 else 1}, {p.cp // (2 if p.cp % 2 == 0 else 1)}]",
            )
    elif p.hierarchical_cp_sizes is not None:
        err(
            "parallel.hierarchical_cp_sizes",
            p.hierarchical_cp_sizes,
            "is only used with cp_comm_type a2a+p2p",
            "set it to null, or set parallel.cp_comm_type=a2a+p2p",
        )
    if p.cp_comm_type in ("a2a", "a2a+p2p") and p.cp > 1:
        a2a = p.cp if p.cp_comm_type == "a2a" else (p.hierarchical_cp_sizes or [p.cp])[0]
        if (heads // max(p.tp, 1)) % a2a:
            err(
                "parallel.cp_comm_type",
                p.cp_comm_type,
                f"all-to-all CP needs heads/tp ({heads // max(p.tp, 1)}) divisible by the a2a size ({a2a})",
                "use cp_comm_type=p2p",
            )

    if p.order not in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"):
        err("parallel.order", p.order, "unsupported rank order", "use tp-cp-ep-dp-pp or tp-cp-ep-pp-dp")
    expert_tp = etp(p)
    if m.num_experts is None:
        if p.ep > 1:
            err(
                "parallel.ep",
                p.ep,
                "expert parallelism needs an MoE model (model.num_experts)",
                "set parallel.ep=1 or model.num_experts",
            )
        if p.etp is not None and p.etp != p.tp:
            err("parallel.etp", p.etp, "expert tensor parallelism needs an MoE model", "set parallel.etp=null")
    else:
        if m.num_experts >= 1 and m.num_experts % p.ep:
            err(
                "parallel.ep",
                p.ep,
                f"must divide model.num_experts ({m.num_experts})",
                f"use one of {', '.join(map(str, divisors(m.num_experts)))}",
            )
        if expert_tp < 1:
            err("parallel.etp", expert_tp, "must be >= 1", "use null (= tp)")
        elif world % (expert_tp * p.ep * p.pp):
            err(
                "parallel.ep",
                p.ep,
                f"expert ranks etp*ep*pp = {expert_tp}*{p.ep}*{p.pp} must divide the world size ({world})",
                "choose ep and etp so that etp*ep*pp divides the world size",
            )
        elif p.ep * expert_tp > c.gpus_per_node:
            warn(
                "parallel.ep",
                p.ep,
                f"expert parallelism x etp ({p.ep * expert_tp}) spans nodes; "
                "its all-to-all crosses the inter-node network",
                f"keep ep*etp <= {c.gpus_per_node}",
            )
        if p.tp > 1 and not p.sequence_parallel:
            # Megatron-LM's validate_args asserts it, and megatron-core's MoELayer refuses to train without it
            # (transformer/moe/moe_layer.py:381): TP ranks would feed the experts the same tokens twice.
            err(
                "parallel.sequence_parallel",
                False,
                f"an MoE model with tp > 1 (tp = {p.tp}) needs sequence parallelism, as Megatron requires",
                "set parallel.sequence_parallel=true",
            )

    if p.order == "tp-cp-ep-pp-dp" and p.pp > 1 and expert_tp * p.ep != p.tp * p.cp:
        # initialize_model_parallel asserts this for dense models too (etp defaults to tp, ep to 1).
        err(
            "parallel.order",
            p.order,
            f"with dp outermost and pp > 1, Megatron needs the expert and attention "
            f"data-parallel sizes equal, i.e. etp*ep ({expert_tp * p.ep}) == tp*cp ({p.tp * p.cp})",
            "use order tp-cp-ep-dp-pp" + (", or choose ep/etp with etp*ep == tp*cp" if m.num_experts else ""),
        )


def stage_layer_counts(spec: LayoutSpec) -> list[int] | None:
    """Layers per pipeline stage exactly as Megatron splits them; None when the split is invalid."""
    return layer_counts(spec.model.num_layers, spec.parallel)


def layer_split_problems(spec: LayoutSpec) -> list[Problem]:
    """The layer-split rules alone (pp, vpp, first/last stages, embedding/loss accounting)."""
    errors: list[Problem] = []
    _layer_split_rules(
        spec, lambda path, value, rule, fix: errors.append(Problem(path=path, value=value, rule=rule, fix=fix))
    )
    return errors


def _layer_split_rules(spec: LayoutSpec, err) -> None:
    m, p = spec.model, spec.parallel
    n, pp = m.num_layers, p.pp
    if n < 1:
        return
    if pp > n:
        err("parallel.pp", pp, f"more pipeline stages than model.num_layers ({n})", f"use pp <= {n}")
        return
    first, last = p.first_stage_layers, p.last_stage_layers
    uneven = first is not None or last is not None
    if split_accounting(p) != (0, 0):
        accounted_split_rules(spec, err)
        return
    for fname, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        if value is not None and value < 1:
            err(f"parallel.{fname}", value, "must be >= 1", "use null for an even split")
            return
    if uneven and pp < 2:
        err(
            "parallel.first_stage_layers" if first is not None else "parallel.last_stage_layers",
            first if first is not None else last,
            "an uneven split needs pp >= 2",
            "set it to null or raise pp",
        )
        return
    counts = stage_layer_counts(spec)
    if counts is None:
        if not uneven:
            ok = [d for d in divisors(n) if d <= 64]
            err(
                "parallel.pp",
                pp,
                f"must divide model.num_layers ({n}) for an even split",
                f"use one of {', '.join(map(str, ok))}, or set parallel.first_stage_layers/last_stage_layers",
            )
        else:
            middle = pp - (first is not None) - (last is not None)
            rest = n - (first or 0) - (last or 0)
            path = "parallel.first_stage_layers" if first is not None else "parallel.last_stage_layers"
            value = first if first is not None else last
            if middle:
                err(
                    path,
                    value,
                    f"the remaining {rest} layers must split evenly over the {middle} middle stage(s)",
                    "choose first/last so that num_layers - first - last is a positive multiple of the middle "
                    "stage count",
                )
            else:
                err(
                    path,
                    value,
                    f"first_stage_layers + last_stage_layers ({first} + {last}) must equal "
                    f"model.num_layers ({n}) when pp = 2",
                    f"e.g. first_stage_layers={first} and last_stage_layers={n - first}"
                    if first is not None and 0 < first < n
                    else "set them to sum to num_layers",
                )
        return
    if p.vpp is not None:
        if p.vpp < 1:
            err("parallel.vpp", p.vpp, "must be >= 1, or null", "use null to disable interleaving")
        elif p.vpp > 1 and pp < 2:
            err("parallel.vpp", p.vpp, "interleaving needs pp >= 2", "set parallel.vpp=null")
        elif p.vpp > 1 and uneven and pp - (first is not None) - (last is not None) == 0:
            # megatron-core 0.16's interleaved offset divides by the middle-stage count (0 here) and crashes.
            err(
                "parallel.vpp",
                p.vpp,
                "interleaving with an uneven split needs at least one middle stage "
                "(both first_stage_layers and last_stage_layers are set and pp = 2)",
                "set parallel.vpp=null, drop one of first/last_stage_layers, or raise pp",
            )
        elif p.vpp > 1:
            bad = [i for i, k in enumerate(counts) if k % p.vpp or k == 0]
            if bad:
                err(
                    "parallel.vpp",
                    p.vpp,
                    f"every stage's layer count ({counts}) must be a positive multiple of vpp",
                    f"use a vpp dividing {math.gcd(*counts)}",
                )
