"""Rules of the layout's data section: a data file's path and suffix, the tokenizer folder, and what only the
built-in Markov chain has. Called by validate.validate_fields with its `err` and `warn` collectors; the file's
contents are checked by specdraft.datafile (validate, launch, and every rank before it trains)."""

from __future__ import annotations

import os

from specdraft.spec.derived import length_multiple
from specdraft.spec.schema import DataSpec, LayoutSpec

SUFFIXES = (".jsonl", ".parquet")
CONVERT = "convert it to JSON lines (one object per line) or parquet; docs/data.md lists the row formats"


def data_rules(spec: LayoutSpec, err, warn) -> None:
    d, m, t = spec.data, spec.model, spec.training
    if d.path is None:
        defaults = DataSpec()
        for name in ("format", "shuffle", "seed"):
            if getattr(d, name) != getattr(defaults, name):
                warn(
                    f"data.{name}",
                    getattr(d, name),
                    "has no effect without data.path (the built-in Markov chain has no file to read)",
                    f"set data.path, or drop data.{name}",
                )
        return
    if not d.path.lower().endswith(SUFFIXES):
        err("data.path", d.path, "must name a .jsonl or .parquet file (the suffix says how to read it)", CONVERT)
    # The ranks run inside the run folder: a relative path would be looked up there, not where it was typed.
    if not os.path.isabs(d.path):
        err("data.path", d.path, "must be an absolute path (the ranks run inside the run folder)", _absolute(d.path))
    if m.path is None or not os.path.isabs(m.path):
        err(
            "model.path",
            m.path,
            "must be the absolute path of a local folder when data.path is set: the ranks read its tokenizer files",
            _absolute(m.path) if m.path is not None else "set model.path to the policy's Hugging Face folder",
        )
    if t.data_drift_interval:
        err(
            "training.data_drift_interval",
            t.data_drift_interval,
            "drifts only the built-in Markov chain; a data file is what it is",
            "set training.data_drift_interval=0, or drop data.path",
        )
    multiple = length_multiple(spec.parallel)
    row = t.micro_batch_size * m.seq_length
    if row % multiple:
        err(
            "model.seq_length",
            m.seq_length,
            f"micro_batch_size x seq_length ({row}) must be a multiple of {multiple}: every packed sample is padded "
            f"to a multiple of lcm(16, the layout's padding multiple)",
            f"use model.seq_length={-(-m.seq_length // multiple) * multiple}",
        )


def _absolute(path: str) -> str:
    return f"write it as an absolute path, e.g. {os.path.abspath(path)}"
