"""Published throughput points (benchmarks/calibration_h100.yaml) and what the estimate and the search make of them.

Used by benchmarks/calibrate.py (fit and report) and tests/unit/search/test_search_calibration.py (the accuracy and
ranking targets). A point fixes what its table row publishes (tp, pp, cp, vpp, ep, micro batch) and what the cited
recipe of the run sets (recompute, sequence parallelism, expert tp, the pipeline split): its estimate is the best
verified layout with those values, and its rank counts distinct published-field tuples in the search's order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specdraft.perf.costs import Efficiency
from specdraft.perf.estimate import CALIBRATED
from specdraft.search.ranking import Row, search
from specdraft.spec.schema import ClusterSpec, DraftSpec, LayoutSpec, ModelSpec, TrainingSpec

PUBLISHED = frozenset(
    {"parallel.tp", "parallel.pp", "parallel.cp", "parallel.vpp", "parallel.ep", "training.micro_batch_size"}
)
BATCH = frozenset({"training.micro_batch_size"})  # what a ranking search keeps at the run's value


@dataclass(frozen=True, kw_only=True)
class Point:
    """One published measurement: the model, cluster, batch and layout of a table row, and its tokens/s/GPU."""

    id: str
    source: str
    url: str
    row: str
    model: dict
    gpus: int
    dtype: str
    global_batch_size: int
    micro_batch_size: int
    seq_length: int
    layout: dict
    tokens_per_s_per_gpu: float
    settings: dict  # spec fields ("training.recompute": "none", ...) the run's recipe sets and the row does not print
    recipe: str  # where `settings` come from

    @property
    def key(self) -> tuple:
        """(tp, pp, cp, vpp, ep, micro batch) as the row publishes them (vpp None = no interleaving)."""
        p = self.layout
        return p["tp"], p["pp"], p["cp"], p["vpp"], p["ep"], self.micro_batch_size


def load_points(path: str | Path) -> list[Point]:
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    out = []
    for raw in data["points"]:
        out.append(
            Point(
                id=raw["id"],
                source=raw["source"],
                url=data["sources"][raw["source"]]["url"],
                row=raw["row"],
                model=dict(data["models"][raw["model"]]),
                gpus=raw["gpus"],
                dtype=raw["dtype"],
                global_batch_size=raw["global_batch_size"],
                micro_batch_size=raw["micro_batch_size"],
                seq_length=raw["seq_length"],
                layout=dict(raw["layout"]),
                tokens_per_s_per_gpu=float(raw["tokens_per_s_per_gpu"]),
                settings=dict(raw.get("settings") or {}),
                recipe=raw.get("recipe", ""),
            )
        )
    return out


def point_spec(point: Point, gpus_per_node: int = 8) -> LayoutSpec:
    """The point's model, cluster and batch (no draft: these are plain Megatron runs) with its published layout.

    NVIDIA's benchmark recipes reduce gradients in bf16 (Megatron-Bridge perf_recipes/_common.py sets
    ddp.grad_reduce_in_fp32 = False), so the points do too. TP communication overlap is off unless the point's
    recipe turns it on (the 24.07 launcher configs predate the recipes' tp > 1 default).
    """
    from specdraft.spec.schema import ParallelSpec

    p = point.layout
    fields: dict[str, dict] = {"parallel": {}, "training": {"tp_comm_overlap": False}}
    for path, value in point.settings.items():
        section, name = path.split(".")
        fields[section][name] = value
    return LayoutSpec(
        name=point.id.replace(".", "-"),
        model=ModelSpec(seq_length=point.seq_length, **point.model),
        cluster=ClusterSpec(num_nodes=point.gpus // gpus_per_node, gpus_per_node=gpus_per_node, gpu="h100-80gb"),
        parallel=ParallelSpec(tp=p["tp"], pp=p["pp"], cp=p["cp"], vpp=p["vpp"], ep=p["ep"], **fields["parallel"]),
        draft=DraftSpec(enabled=False),
        training=TrainingSpec(
            micro_batch_size=point.micro_batch_size,
            global_batch_size=point.global_batch_size,
            dtype=point.dtype,
            grad_reduce_in_bf16=True,
            **fields["training"],
        ),
    )


def row_key(row: Row) -> tuple:
    lay, d = row.layout, row.layout.dims
    return d.tp, d.pp, d.cp, lay.vpp if lay.vpp > 1 else None, d.ep, d.micro_batch_size


def _pins(point: Point) -> frozenset[str]:
    return PUBLISHED | frozenset(point.settings)


def published_variants(point: Point, top_k: int = 64) -> list[Row]:
    """The verified layouts with the point's published fields and recipe settings (what the recipe leaves open,
    such as the split, searched). The run itself shows that its layout fits, so the search's headroom below the
    HBM (kept for layouts nobody ran) does not apply: validation's memory rule does."""
    return list(search(point_spec(point), top_k=top_k, pins=_pins(point), max_memory=1.0).rows)


def published_estimate(point: Point, eff: Efficiency = CALIBRATED) -> Optional[Row]:
    """The best verified layout with the point's published fields and recipe settings, or None when none passes
    validation."""
    rows = search(point_spec(point), top_k=1, pins=_pins(point), eff=eff, max_memory=1.0).rows
    return rows[0] if rows else None


def published_rank(
    point: Point, eff: Efficiency = CALIBRATED, depth: int = 5
) -> tuple[Optional[int], list[tuple], float]:
    """(1-based rank of the published fields among the search's distinct field tuples (None below ``depth``),
    the first ``depth`` tuples, the best estimate in tokens/s/GPU).

    The search runs for the point's model, GPU count, batch sizes and sequence length (the ranking target): the
    global and the micro batch are the run's, every layout field is searched."""
    spec = point_spec(point)
    spec = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, vpp=None))
    top_k = 32
    while True:
        result = search(spec, top_k=top_k, eff=eff, pins=BATCH)
        keys: list[tuple] = []
        for row in result.rows:
            if row_key(row) not in keys:
                keys.append(row_key(row))
        if len(keys) >= depth or len(result.rows) < top_k:
            break
        top_k *= 4
    keys = keys[:depth]
    best = result.rows[0].estimate.tokens_per_s_per_gpu if result.rows else float("nan")
    return (keys.index(point.key) + 1 if point.key in keys else None), keys, best
