"""The figures behind the parity tests' tolerances: per launch, the largest relative deviation of the target, draft
and load-balancing losses from the single-process run, and of the plan's weights/grads/optimizer estimate from what
every rank measured.

Run the tests with a known base folder, then this on it:
    .venv/bin/pytest tests/dist/test_moe_parity.py --basetemp=/tmp/moe-parity
    .venv/bin/python benchmarks/parity_figures.py /tmp/moe-parity
(tests/dist/test_cotrain_parity.py works the same way for the dense layouts.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.memory_accuracy import memory_errors

KEYS = ("target_loss", "draft_loss", "moe_aux_loss")


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def main(base: Path) -> None:
    # pytest also links `<name>current` to the newest `<name>N`: resolve to count each launch once
    [reference] = {p.parent.resolve() for p in base.glob("single*/run/metrics.jsonl")}
    want = rows(reference)
    print(
        f"{'launch':18s} {'ranks':>5s} "
        + " ".join(f"{k:>13s}" for k in KEYS)
        + f" {'mem weights':>12s} {'mem grads':>10s} {'mem optim':>10s}"
    )
    for folder in sorted({p.parent.resolve() for p in base.glob("test_*/*/metrics.jsonl")}):
        got = rows(folder)
        deviation = []
        for key in KEYS:
            pairs = [(g[key], w[key]) for g, w in zip(got, want) if w.get(key) is not None]
            deviation.append(max(abs(g - w) / abs(w) for g, w in pairs) if pairs else None)
        errors = memory_errors(folder)
        worst = [max(abs(per_rank[k]) for per_rank in errors.values()) for k in ("weights", "grads", "optimizer")]
        print(
            f"{folder.name:18s} {len(errors):5d} "
            + " ".join(f"{d:13.1e}" if d is not None else f"{'-':>13s}" for d in deviation)
            + f" {worst[0]:12.1e} {worst[1]:10.1e} {worst[2]:10.1e}"
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
