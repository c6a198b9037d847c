"""TapChannel's cost on this CPU: pipeline step time with pp=2 against no draft and against blocking sends.

Run: `.venv/bin/python benchmarks/tapchannel.py [--steps N] [OVERRIDES...]`. Three real local launches of the same
layout (gloo, one process per rank), measured in the same run:
  - no draft: the pipeline alone (draft.enabled=false);
  - TapChannel: asynchronous isend/irecv on dedicated pair groups into landing slots;
  - blocking: dist.send inside the forward hooks (NeMo-RL main's approach; receives pre-posted, else it deadlocks).
  - equal work: the draft runs on zero taps of the same shapes and nothing travels (the draft's own compute).
It prints the median step time after warm-up and the ratios; TapChannel's overhead is its step time over the
equal-work step: what moving the taps costs on top of the pipeline plus the draft.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["cluster.gpus_per_node=2", "parallel.cp=1", "parallel.pp=2", "model.hidden_size=128",
        "model.ffn_hidden_size=512", "model.seq_length=256", "training.global_batch_size=8",
        "training.warmup_steps=0"]


def run(label: str, overrides: list[str], steps: int, env: dict, root: Path) -> list[dict]:
    folder = root / label
    cmd = [str(Path(sys.executable).with_name("specdraft")), "launch", *overrides, "--executor", "local",
           "--workload", "cotrain", "--steps", str(steps), "--run-dir", str(folder)]
    proc = subprocess.run(cmd, cwd=root, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed:\n{proc.stdout}\n{proc.stderr}")
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--skip", type=int, default=4, help="warm-up steps left out of the medians")
    parser.add_argument("overrides", nargs="*", help="extra layout overrides")
    args = parser.parse_args()
    layout = [*BASE, *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = {
            "no draft": run("nodraft", [*layout, "draft.enabled=false"], args.steps, {}, root),
            "equal work": run("equal", layout, args.steps, {"SPECDRAFT_TAPS_SYNTHETIC": "1"}, root),
            "TapChannel": run("tapchannel", layout, args.steps, {}, root),
            "blocking": run("blocking", layout, args.steps, {"SPECDRAFT_TAPS_BLOCKING": "1"}, root),
        }
    med = {k: statistics.median(r["step_time_s"] for r in v[args.skip:]) for k, v in rows.items()}
    print(f"layout: {' '.join(layout)}; {args.steps} steps, medians over the last {args.steps - args.skip}")
    print(f"{'mode':<12} {'step s':>8} {'tap bytes/step':>15} {'vs no draft':>12} {'vs equal work':>14}")
    for mode in rows:
        print(f"{mode:<12} {med[mode]:>8.3f} {rows[mode][-1]['tap_bytes']:>15,} "
              f"{med[mode] / med['no draft']:>11.3f}x {med[mode] / med['equal work']:>13.3f}x")
    print(f"TapChannel overhead over equal work: {med['TapChannel'] / med['equal work'] - 1:+.1%} (target <= 10%)")
    print(f"TapChannel step / blocking step: {med['TapChannel'] / med['blocking']:.3f}x (target <= 1)")


if __name__ == "__main__":
    main()
