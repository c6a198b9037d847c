"""What a search hands back: the JSON rows and the best layout as a YAML that `plan` and `launch` accept as is."""

from __future__ import annotations

from specdraft.search.ranking import Row, SearchResult
from specdraft.spec.load import spec_to_dict


def row_json(row: Row) -> dict:
    """One layout as a JSON row (docs/search.md), plus `layer_split` (the uneven or accounted split it uses)."""
    lay, est = row.layout, row.estimate
    p = lay.dims
    return {
        "parallel": {
            "tp": p.tp,
            "cp": p.cp,
            "pp": p.pp,
            "vpp": p.vpp,
            "dp": p.dp,
            "ep": p.ep,
            "etp": p.etp,
            "sequence_parallel": p.sequence_parallel,
        },
        "layer_split": {
            "first_stage_layers": p.first_stage_layers,
            "last_stage_layers": p.last_stage_layers,
            "account_for_embedding_in_pipeline_split": p.account_for_embedding_in_pipeline_split,
            "account_for_loss_in_pipeline_split": p.account_for_loss_in_pipeline_split,
        },
        "training": {"micro_batch_size": p.micro_batch_size, "recompute": lay.recompute},
        "draft_stage": row.layout.draft_stage,
        "step_time_s": round(est.step_time_s, 6),
        "tokens_per_s_per_gpu": round(est.tokens_per_s_per_gpu, 3),
        "mfu": round(est.mfu, 6),
        "peak_memory_bytes": row.peak_memory_bytes,
        "breakdown": {key: round(value, 6) for key, value in est.breakdown.items()},
    }


def result_json(result: SearchResult) -> dict:
    return {"layouts": [row_json(row) for row in result.rows]}


def layout_yaml(row: Row) -> str:
    """The whole layout of ``row`` as YAML: every section, every field, loadable by `specdraft plan` as is."""
    import yaml

    est = row.estimate
    header = (
        f"# Written by `specdraft search`: estimated {est.step_time_s:.3f} s per step, "
        f"{est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {est.mfu:.1%}, "
        f"peak {row.peak_memory_bytes / 2**30:.1f} GiB per GPU.\n"
    )
    body = yaml.safe_dump(spec_to_dict(row.spec), sort_keys=False, default_flow_style=False, allow_unicode=True)
    return header + body
