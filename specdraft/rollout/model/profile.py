"""Decode-step profile tables: generated from the cost model, written/read as CSV, interpolated in the simulator.

CSV columns: tp, batch, context (mean KV tokens per running sequence), decode_s (one plain decode step) and,
optionally, speculative_decode_s (k draft steps + one (k+1)-token verify). A measured table replaces the model.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from specdraft.errors import UserError
from specdraft.rollout.model.costmodel import CostModel, ModelShape, from_spec

COLUMNS = ("tp", "batch", "context", "decode_s", "speculative_decode_s")
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


# Llama-2-7B as microsoft/vidur profiled it (MHA, 32 layers, gated MLP of 11008): the calibration's reference model.
LLAMA2_7B = ModelShape(
    layers=32,
    hidden=4096,
    attn_params=4 * 4096 * 4096,
    mlp_params=3 * 4096 * 11008,
    mlp_weight_params=3 * 4096 * 11008,
    head_params=32000 * 4096,
    kv_bytes_per_token=2 * 32 * 4096 * 2,
    attn_width=4096,
    total_params=6_738_415_616,
    kv_heads=32,
    vocab=32000,
)


# vLLM's custom all-reduce on H100 (SGLang PR #2904; float32 tensors, so 4 bytes per element), and NCCL's at 1M fp16
# elements (vidur's network/h100_dgx/all_reduce.csv): the anchors of costmodel's all-reduce.
ALLREDUCE_ANCHORS = (
    (2, 16384, "8.8"),
    (8, 16384, "9.3"),
    (8, 131072, "11.8"),
    (8, 2**20, "24.1"),
    (2, 4 * 2**20, "26.6"),
    (8, 4 * 2**20, "45.0"),
)


def calibration_rows(cost: CostModel) -> list[tuple[str, str, str]]:
    """(anchor, published figure, this model) for the published anchors, on the layout's GPU and model.

    The vidur and all-reduce rows are H100 measurements, so they match only on an h100-80gb layout.
    """
    us = 1e6
    rows = [
        (f"vidur Llama-2-7B layer, tp {tp}, {n} tokens", f"{ref} us", f"{cost.layer_s(LLAMA2_7B, n, tp) * us:.0f} us")
        for tp, n, ref in ((1, 64, "~180"), (8, 64, "~45"), (1, 512, "375"))
    ]
    rows += [
        (
            f"vLLM custom all-reduce, tp {tp}, {nbytes // 1024} KB",
            f"{ref} us",
            f"{cost.allreduce(tp, nbytes) * us:.1f} us",
        )
        for tp, nbytes, ref in ALLREDUCE_ANCHORS
    ]
    rows += [
        (
            f"NCCL all-reduce of 1M fp16 elements, tp {tp}",
            "34-43 us",
            f"{cost.nccl_allreduce(tp, 2 * 2**20) * us:.0f} us",
        )
        for tp in (2, 8)
    ]
    for batch, ctx in ((1, 2048), (8, 4096), (64, 4096)):
        ratio = cost.decode_step(1, batch, batch * ctx, False) / cost.decode_step(8, batch, batch * ctx, False)
        note = "1.3-2x (derived from vidur; assumes 30-45 us all-reduces)" if batch <= 8 else "(KV-bound: no anchor)"
        rows.append((f"decode step tp1 / tp8, batch {batch}, context {ctx}", note, f"{ratio:.2f}x"))
    return rows


def valid_tps(spec) -> list[int]:
    """TP sizes an instance of the layout's model may use: divisors of the node that shard the heads and fit."""
    c, m = spec.cluster, spec.model
    cost = from_spec(spec)
    return [
        tp
        for tp in range(1, c.gpus_per_node + 1)
        if c.gpus_per_node % tp == 0 and m.num_attention_heads % tp == 0 and cost.kv_capacity_tokens(tp) > 0
    ]


def table_rows(cost: CostModel, tps: list[int], batches=BATCHES, contexts=CONTEXTS) -> list[dict]:
    """The profile grid from the cost model (speculative_decode_s is empty when the layout does not speculate)."""
    rows = []
    for tp in tps:
        for b in batches:
            if b > cost.max_num_seqs:
                continue
            for ctx in contexts:
                row = {"tp": tp, "batch": b, "context": ctx, "decode_s": cost.decode_step(tp, b, b * ctx, False)}
                row["speculative_decode_s"] = cost.decode_step(tp, b, b * ctx, True) if cost.speculative else None
                rows.append(row)
    return rows


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        speculative = "" if r["speculative_decode_s"] is None else f"{r['speculative_decode_s']:.9g}"
        writer.writerow([r["tp"], r["batch"], r["context"], f"{r['decode_s']:.9g}", speculative])
    return out.getvalue()


def _number(raw: str, name: str, line: int, path, integer: bool) -> float:
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise UserError(
            f"{path}: line {line}: {name} = {raw!r} is not a {'whole ' if integer else ''}number",
            "write plain numbers (seconds for the *_s columns)",
        ) from None
    if not value > 0 or (not integer and not math.isfinite(value)):
        raise UserError(
            f"{path}: line {line}: {name} = {raw!r} must be a positive number", "a step time or size must be > 0"
        )
    return value


def read_csv(path: str | Path) -> dict:
    """Parse a profile CSV into {(tp, speculative): (batches, contexts, grid)}; every problem names its line."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"profile file not found: {file}", "write one with `specdraft rollout profile --csv FILE`")
    lines = file.read_text(encoding="utf-8").splitlines()
    reader = csv.reader(lines)
    header = next(reader, None)
    if (
        header is None
        or [h.strip() for h in header[:4]] != list(COLUMNS[:4])
        or (len(header) > 4 and [h.strip() for h in header[4:]] != [COLUMNS[4]])
    ):
        raise UserError(
            f"{file}: line 1: the header must be {','.join(COLUMNS[:4])}[,{COLUMNS[4]}], got "
            f"{','.join(header or [])!r}",
            "start the file with the column names",
        )
    has_speculative = len(header) > 4
    points: dict = {}
    for line, row in enumerate(reader, start=2):
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) != len(header):
            raise UserError(
                f"{file}: line {line}: expected {len(header)} columns, got {len(row)}",
                "one value per column, comma-separated",
            )
        tp = int(_number(row[0].strip(), "tp", line, file, True))
        batch = int(_number(row[1].strip(), "batch", line, file, True))
        ctx = _number(row[2].strip(), "context", line, file, False)
        plain = _number(row[3].strip(), "decode_s", line, file, False)
        speculative = None
        if has_speculative and row[4].strip():
            speculative = _number(row[4].strip(), "speculative_decode_s", line, file, False)
        key = (tp, batch, ctx)
        if key in points:
            raise UserError(
                f"{file}: line {line}: duplicate row for tp={tp} batch={batch} context={ctx:g}",
                "keep one measurement per grid point",
            )
        points[key] = (plain, speculative, line)
    if not points:
        raise UserError(f"{file} has no data rows", "add rows below the header")
    tables: dict = {}
    for tp in sorted({k[0] for k in points}):
        batches = sorted({k[1] for k in points if k[0] == tp})
        contexts = sorted({k[2] for k in points if k[0] == tp})
        plain_grid, speculative_grid = [], []
        for b in batches:
            prow, srow = [], []
            for c in contexts:
                if (tp, b, c) not in points:
                    raise UserError(
                        f"{file}: tp={tp} has no row for batch={b} context={c:g}",
                        "the grid of each tp must be complete (every batch x every context)",
                    )
                plain, speculative, line = points[(tp, b, c)]
                prow.append(plain)
                srow.append(speculative)
            plain_grid.append(prow)
            speculative_grid.append(srow)
        tables[(tp, False)] = (batches, contexts, plain_grid)
        cells = [s for row in speculative_grid for s in row]
        if all(s is not None for s in cells):
            tables[(tp, True)] = (batches, contexts, speculative_grid)
        elif any(s is not None for s in cells):
            raise UserError(
                f"{file}: tp={tp} gives speculative_decode_s for some rows only",
                "fill speculative_decode_s on every row of that tp, or on none",
            )
    return tables


def _bracket(grid: list, x: float) -> tuple[int, int, float]:
    """Indices (i, j) and weight w with x = (1-w) grid[i] + w grid[j]; linear extrapolation past the ends."""
    if len(grid) == 1:
        return 0, 0, 0.0
    k = bisect.bisect_right(grid, x)
    i = min(max(k - 1, 0), len(grid) - 2)
    return i, i + 1, (x - grid[i]) / (grid[i + 1] - grid[i])


@dataclass(frozen=True)
class ProfileCost(CostModel):
    """The cost model with decode steps looked up in a (measured) profile, interpolated between grid points.

    Batch is interpolated linearly; along context the step time is linear inside a grid cell, which gives the
    affine form a + b * total_context the fluid engine needs. Prefill and memory still come from the cost model.
    """

    tables: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def wrap(cls, base: CostModel, tables: dict) -> "ProfileCost":
        kwargs = {f.name: getattr(base, f.name) for f in fields(base) if f.name != "_cache"}
        return cls(**kwargs, tables=tables)

    def require(self, tps, source: str) -> None:
        missing = [tp for tp in tps if (tp, False) not in self.tables]
        if missing:
            have = sorted({tp for tp, _ in self.tables})
            raise UserError(
                f"{source} has no rows for tp={', '.join(map(str, missing))} (it covers tp {have})",
                "profile every tp the simulation uses, or drop --adaptive-tp / change rollout.tp",
            )

    def _step(self, tp: int, batch: int, mean_ctx: float, speculative: bool) -> tuple[float, float]:
        """(time at the lower context grid point of the cell, slope per unit of mean context)."""
        batches, contexts, grid = self.tables[(tp, speculative)]
        bi, bj, bw = _bracket(batches, batch)
        ci, cj, _ = _bracket(contexts, mean_ctx)

        def at(c):
            return (1 - bw) * grid[bi][c] + bw * grid[bj][c]

        lo = at(ci)
        slope = 0.0 if ci == cj else (at(cj) - lo) / (contexts[cj] - contexts[ci])
        return lo - slope * contexts[ci], slope

    def affine(self, tp: int, batch: int, speculative: bool, context: float | None = None) -> tuple[float, float]:
        if speculative and (tp, True) not in self.tables:
            speculative = False
        batch = max(batch, 1)
        mean_ctx = (context or 0.0) / batch
        a, slope = self._step(tp, batch, mean_ctx, speculative)
        return max(a, 0.0), slope / batch

    def use_speculation(self, tp: int, batch: int, total_context: float) -> bool:
        if (tp, True) not in self.tables:
            return False
        return super().use_speculation(tp, batch, total_context)
