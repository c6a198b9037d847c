"""Megatron's pipeline layer split: the layers per stage it gives (even, uneven first/last stages, or with the
embedding and/or loss counted as layers) and the rules --account-for-embedding/loss-in-pipeline-split needs.

The embedding and/or the loss each take one layer's slot of the pp x vpp split (megatron-core 0.16
get_num_layers_to_build / get_transformer_layer_offset); specdraft.spec.validate and specdraft.plan.stages call these.
"""

from __future__ import annotations

from typing import Optional, Protocol

from specdraft.spec.schema import LayoutSpec


class PipelineSplit(Protocol):
    """The split fields, as both the spec's parallel section and the plan's resolved one (plan.dims) spell them
    (read-only: both are frozen dataclasses)."""

    @property
    def pp(self) -> int: ...
    @property
    def vpp(self) -> Optional[int]: ...
    @property
    def first_stage_layers(self) -> Optional[int]: ...
    @property
    def last_stage_layers(self) -> Optional[int]: ...
    @property
    def account_for_embedding_in_pipeline_split(self) -> bool: ...
    @property
    def account_for_loss_in_pipeline_split(self) -> bool: ...


def split_accounting(split: PipelineSplit) -> tuple[int, int]:
    """(embedding, loss): 1 each when Megatron counts it as a layer in the pipeline split, else 0."""
    return int(split.account_for_embedding_in_pipeline_split), int(split.account_for_loss_in_pipeline_split)


def layer_counts(num_layers: int, split: PipelineSplit) -> list[int] | None:
    """Layers per pipeline stage exactly as Megatron splits ``num_layers``; None when the split is invalid."""
    n, pp = num_layers, split.pp
    first, last = split.first_stage_layers, split.last_stage_layers
    if pp < 1 or n < 1:
        return None
    if split_accounting(split) != (0, 0):
        return accounted_counts(n, split)
    if first is None and last is None:
        return [n // pp] * pp if n % pp == 0 else None
    if pp < 2:
        return None
    middle_stages = pp - (first is not None) - (last is not None)
    rest = n - (first or 0) - (last or 0)
    if rest < 0 or (middle_stages > 0 and rest % middle_stages) or (middle_stages == 0 and rest):
        return None
    per = rest // middle_stages if middle_stages else 0
    counts = [per] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def accounted_counts(num_layers: int, split: PipelineSplit) -> list[int] | None:
    """Megatron's split with the embedding and/or loss counted as layers: (N + e + l) / pp per stage, then the
    first stage builds e fewer and the last l fewer (megatron-core get_num_layers_to_build)."""
    e, loss = split_accounting(split)
    total = num_layers + e + loss
    if split.first_stage_layers is not None or split.last_stage_layers is not None or total % split.pp:
        return None
    counts = [total // split.pp] * split.pp
    counts[0] -= e
    counts[-1] -= loss
    return counts if min(counts) >= 0 else None


def accounted_split_rules(spec: LayoutSpec, err) -> None:
    p, n = spec.parallel, spec.model.num_layers
    e, loss = split_accounting(p)
    path = "parallel.account_for_embedding_in_pipeline_split" if e else "parallel.account_for_loss_in_pipeline_split"
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        err(
            path,
            True,
            "Megatron cannot count the embedding or loss as a layer together with an uneven split "
            "(first_stage_layers/last_stage_layers)",
            "drop one of them",
        )
        return
    total = n + e + loss
    if total % p.pp:
        ok = [d for d in range(1, n + 1) if total % d == 0]
        err(
            "parallel.pp",
            p.pp,
            f"must divide num_layers + the accounted embedding/loss ({n} + {e + loss} = {total})",
            f"use one of {', '.join(map(str, ok))}, or change the account_for_* fields",
        )
        return
    vpp = p.vpp if p.vpp and p.vpp > 1 and p.pp > 1 else 1
    if p.vpp is not None and p.vpp < 1:
        err("parallel.vpp", p.vpp, "must be >= 1, or null", "use null to disable interleaving")
    elif p.vpp is not None and p.vpp > 1 and p.pp < 2:
        err("parallel.vpp", p.vpp, "interleaving needs pp >= 2", "set parallel.vpp=null")
    elif (total // p.pp) % vpp:
        err(
            "parallel.vpp",
            p.vpp,
            f"must divide the layers per stage counting the embedding/loss ({total} / pp {p.pp} = {total // p.pp})",
            f"use a vpp dividing {total // p.pp}",
        )
    elif total // p.pp // vpp <= max(e, loss):
        err(
            "parallel.pp",
            p.pp,
            "leaves a model chunk with no transformer layer once the embedding or loss takes its place",
            "lower pp or vpp",
        )
