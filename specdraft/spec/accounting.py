"""Megatron's --account-for-embedding/loss-in-pipeline-split: the counts it gives and the rules it needs.

The embedding and/or the loss each take one layer's slot of the pp x vpp split (megatron-core 0.16
get_num_layers_to_build / get_transformer_layer_offset); specdraft.spec.validate calls these.
"""

from __future__ import annotations

from specdraft.spec.schema import LayoutSpec, ParallelSpec


def split_accounting(parallel: ParallelSpec) -> tuple[int, int]:
    """(embedding, loss): 1 each when Megatron counts it as a layer in the pipeline split, else 0."""
    return int(parallel.account_for_embedding_in_pipeline_split), int(parallel.account_for_loss_in_pipeline_split)


def accounted_counts(spec: LayoutSpec) -> list[int] | None:
    """Megatron's split with the embedding and/or loss counted as layers: (N + e + l) / pp per stage, then the
    first stage builds e fewer and the last l fewer (megatron-core get_num_layers_to_build)."""
    p = spec.parallel
    e, loss = split_accounting(p)
    total = spec.model.num_layers + e + loss
    if p.first_stage_layers is not None or p.last_stage_layers is not None or total % p.pp:
        return None
    counts = [total // p.pp] * p.pp
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
