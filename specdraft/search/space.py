"""The search space: every base (a ParallelDims of tp, cp, pp, dp, ep, etp, sequence parallelism and micro batch,
with a recompute mode) and every layer split of it.

Bases are built to satisfy the shape rules by construction (sizes divide the world, heads, experts, the sequence
and the global batch); the real validation still runs on every layout a search returns. Splits are Megatron's:
even, with the embedding and/or loss counted as a layer, or uneven first/last stages, each with every vpp that
divides it. Uneven ends are searched up to `max_end_deficit` layers lighter than the middle stages (see there).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Optional

from specdraft.plan.dims import ParallelDims
from specdraft.spec import derived
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate.parallel import divisors

RECOMPUTE = ("none", "selective", "full")
# The spec fields a search varies (and `--pin` may fix); everything else comes from the spec.
SEARCHED = (
    "parallel.tp",
    "parallel.cp",
    "parallel.pp",
    "parallel.dp",
    "parallel.vpp",
    "parallel.ep",
    "parallel.etp",
    "parallel.sequence_parallel",
    "parallel.first_stage_layers",
    "parallel.last_stage_layers",
    "parallel.account_for_embedding_in_pipeline_split",
    "parallel.account_for_loss_in_pipeline_split",
    "training.micro_batch_size",
    "training.recompute",
    "draft.stage",
)


class Base(NamedTuple):
    """Everything but the layer split and the draft's stage: the sizes (their split left even) and the recompute
    mode; `Layout(*base, chunks, draft_stage)` is a candidate."""

    dims: ParallelDims
    recompute: str


class Split(NamedTuple):
    """A Megatron layer split: the spec fields and the per-stage, per-chunk layer counts they give."""

    first: Optional[int]
    last: Optional[int]
    embedding: bool
    loss: bool
    vpp: Optional[int]
    chunks: tuple[tuple[int, ...], ...]


def _pinned(spec: LayoutSpec, pins: frozenset[str], field: str, options):
    """Only the spec's own value when ``field`` is pinned, else ``options``."""
    if field not in pins:
        return options
    section, name = field.split(".")
    return [getattr(getattr(spec, section), name)]


def bases(spec: LayoutSpec, pins: frozenset[str]) -> list[Base]:
    """Every base whose sizes fit the world, the heads, the experts, the sequence and the global batch."""
    m, p, t = spec.model, spec.parallel, spec.training
    world = derived.world_size(spec)
    heads = math.gcd(m.num_attention_heads, derived.kv_heads(m))
    out = []
    for tp in _pinned(spec, pins, "parallel.tp", [d for d in divisors(heads) if world % d == 0]):
        for cp in _pinned(spec, pins, "parallel.cp", divisors(world // tp) if world % tp == 0 else []):
            if cp > 1 and m.seq_length % derived.pad_multiple(cp, tp, False):
                continue
            rest = world // (tp * cp) if world % (tp * cp) == 0 else 0
            for pp in _pinned(spec, pins, "parallel.pp", [d for d in divisors(rest) if d <= m.num_layers]):
                if rest % pp:
                    continue
                dp = rest // pp
                if "parallel.dp" in pins and p.dp not in (-1, dp):
                    continue
                if t.global_batch_size % dp:
                    continue
                for ep, etp in _experts(spec, pins, world, tp, cp, pp):
                    for sp in _pinned(spec, pins, "parallel.sequence_parallel", [False, True] if tp > 1 else [False]):
                        if sp and (tp == 1 or m.seq_length % derived.pad_multiple(cp, tp, sp)):
                            continue
                        sizes = dict(world_size=world, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
                        by_mbs: dict[int, ParallelDims] = {}
                        for rc in _pinned(spec, pins, "training.recompute", RECOMPUTE):
                            for mbs in _pinned(
                                spec, pins, "training.micro_batch_size", divisors(t.global_batch_size // dp)
                            ):
                                if t.global_batch_size % (mbs * dp) == 0:
                                    dims = by_mbs.get(mbs)
                                    if dims is None:
                                        dims = by_mbs[mbs] = _dims(spec, sizes, sp, mbs)
                                    out.append(Base(dims, rc))
    return out


def _dims(spec: LayoutSpec, sizes: dict, sequence_parallel: bool, micro_batch_size: int) -> ParallelDims:
    """A base's sizes with the spec's settings the search does not vary (order, CP communication); the layer split
    is left even, since a split comes with each candidate."""
    p = spec.parallel
    return ParallelDims.resolve(
        **sizes,
        sequence_parallel=sequence_parallel,
        micro_batch_size=micro_batch_size,
        global_batch_size=spec.training.global_batch_size,
        order=p.order,
        cp_comm_type=p.cp_comm_type,
        hierarchical_cp_sizes=tuple(p.hierarchical_cp_sizes) if p.hierarchical_cp_sizes is not None else None,
    )


def _experts(spec: LayoutSpec, pins: frozenset[str], world: int, tp: int, cp: int, pp: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs: ep divides the experts, etp divides tp, etp*ep*pp divides the world (and, with dp
    outermost and pp > 1, Megatron's etp*ep == tp*cp)."""
    m, p = spec.model, spec.parallel
    if not m.num_experts:
        return [(1, tp)] if "parallel.etp" not in pins or p.etp in (None, tp) else []
    pairs = []
    for ep in _pinned(spec, pins, "parallel.ep", divisors(m.num_experts)):
        etps = [p.etp if p.etp is not None else tp] if "parallel.etp" in pins else divisors(tp)
        for etp in etps:
            if etp < 1 or world % (etp * ep * pp):
                continue
            if p.order == "tp-cp-ep-pp-dp" and pp > 1 and etp * ep != tp * cp:
                continue
            pairs.append((ep, etp))
    return pairs


def max_end_deficit(spec: LayoutSpec) -> int:
    """How many layers lighter than the middle stages an uneven end stage is searched.

    An end stage carries work beyond its layers (the LM head, the draft and its taps); making it lighter by more
    than that work, counted in layers' worth of FLOPs, cannot lower the slowest stage. Two layers of headroom
    cover the elementwise and communication terms a FLOP count misses.
    """
    m, d = spec.model, spec.draft
    h, f = m.hidden_size, (m.moe_ffn_hidden_size or 0) * m.moe_router_topk if m.num_experts else m.ffn_hidden_size
    q, kv = m.num_attention_heads * derived.head_dim(m), derived.kv_heads(m) * derived.head_dim(m)
    layer = h * (q + 2 * kv) + q * h + (3 if m.swiglu else 2) * h * f
    head = h * m.vocab_size
    extra = head
    if d.enabled:
        draft_layer = 2 * h * (q + 2 * kv) + q * h + (3 if m.swiglu else 2) * h * m.ffn_hidden_size
        draft_head = h * derived.draft_vocab_size(spec)
        extra += len(derived.aux_layers(spec)) * h * h + d.ttt_steps * (d.num_layers * draft_layer + draft_head)
    return math.ceil(extra / layer) + 2


def splits(spec: LayoutSpec, pp: int, pins: frozenset[str]) -> list[Split]:
    """Every layer split over ``pp`` stages the search considers, with every vpp each one allows."""
    n = spec.model.num_layers
    found: list[tuple] = []
    if n % pp == 0:
        found.append((None, None, False, False))
    for e, loss in ((True, False), (False, True), (True, True)) if pp > 1 else ():
        if (n + e + loss) % pp == 0:
            found.append((None, None, e, loss))
    if pp >= 2:
        deficit = max_end_deficit(spec)
        for d_first in range(deficit + 1):
            for d_last in range(deficit + 1):
                if (d_first == 0 and d_last == 0) or (n + d_first + d_last) % pp:
                    continue
                middle = (n + d_first + d_last) // pp
                first, last = middle - d_first, middle - d_last
                if first < 1 or last < 1:
                    continue
                if pp == 2 and d_first and d_last:
                    continue  # with no middle stage, the same counts as a one-sided split
                found.append((first if d_first else None, last if d_last else None, False, False))
    out = []
    p = spec.parallel
    fields = (
        "first_stage_layers",
        "last_stage_layers",
        "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split",
    )
    for values in found:
        if any(f"parallel.{name}" in pins and value != getattr(p, name) for name, value in zip(fields, values)):
            continue
        first, last, e, loss = values
        if e or loss:
            unit = (n + e + loss) // pp
        else:
            middle = (n - (first or 0) - (last or 0)) // max(pp - (first is not None) - (last is not None), 1)
            unit = (
                math.gcd(first or middle, last or middle, middle)
                if pp > 2
                else math.gcd(first or middle, last or middle)
            )
        for vpp in _vpps(spec, pp, unit, pins):
            chunks = _chunks(spec, pp, first, last, e, loss, vpp)
            if chunks is not None:
                out.append(Split(first, last, e, loss, vpp, chunks))
    return out


def _vpps(spec: LayoutSpec, pp: int, unit: int, pins: frozenset[str]) -> list[Optional[int]]:
    """No interleaving, and every vpp dividing ``unit`` (the layers every stage's count is a multiple of)."""
    if "parallel.vpp" in pins:
        return [spec.parallel.vpp]
    return [None] + ([v for v in divisors(unit) if v > 1] if pp > 1 else [])


_CHUNKS: dict[tuple, object] = {}


def _chunks(spec: LayoutSpec, pp: int, first, last, e: bool, loss: bool, vpp) -> tuple | None:
    """Per-stage, per-chunk layer counts from specdraft.plan.stages (Megatron's own map), or None when the
    field rules refuse the split (layers per stage not a multiple of vpp, an empty chunk, ...)."""
    key = (spec.model.num_layers, pp, first, last, e, loss, vpp)
    if key in _CHUNKS:
        return _CHUNKS[key]
    from specdraft.plan.stages import chunk_layout
    from specdraft.spec.validate.parallel import layer_split_problems

    # The split rules read the spec, so the split is checked on it and mapped from its parallel section.
    probe = dataclasses.replace(
        spec,
        parallel=dataclasses.replace(
            spec.parallel,
            pp=pp,
            vpp=vpp,
            first_stage_layers=first,
            last_stage_layers=last,
            account_for_embedding_in_pipeline_split=e,
            account_for_loss_in_pipeline_split=loss,
        ),
    )
    result = None
    if not layer_split_problems(probe):
        result = tuple(
            tuple(count for _, count in stage) for stage in chunk_layout(probe.model.num_layers, probe.parallel)
        )
    _CHUNKS[key] = result
    return result


def candidate_spec(spec: LayoutSpec, base: Base, split: Split, draft_stage: Optional[int]) -> LayoutSpec:
    """The full layout of one candidate: ``spec`` with the searched fields replaced."""
    p, t, d, dims = spec.parallel, spec.training, spec.draft, base.dims
    stage = d.stage if draft_stage is None else derived.stage_value(draft_stage, dims.pp)
    return dataclasses.replace(
        spec,
        parallel=dataclasses.replace(
            p,
            tp=dims.tp,
            cp=dims.cp,
            pp=dims.pp,
            dp=dims.dp,
            ep=dims.ep,
            etp=None if dims.etp == dims.tp else dims.etp,
            sequence_parallel=dims.sequence_parallel,
            vpp=split.vpp,
            first_stage_layers=split.first,
            last_stage_layers=split.last,
            account_for_embedding_in_pipeline_split=split.embedding,
            account_for_loss_in_pipeline_split=split.loss,
        ),
        training=dataclasses.replace(t, micro_batch_size=dims.micro_batch_size, recompute=base.recompute),
        draft=dataclasses.replace(d, stage=stage),
    )
