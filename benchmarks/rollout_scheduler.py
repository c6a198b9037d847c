"""Speed of the asp rollout scheduler on 100K prompts over 64 instances, against a naive baseline in the same run.

Run: `.venv/bin/python benchmarks/rollout_scheduler.py [--prompts N] [--instances N] [--repeats N]`. The workload
(n = 8 samples per prompt, steps of 1,024 prompts, log-normal lengths) is built once; the scheduler's pass is
timed (median of the repeats) and compared with fifo (round-robin dealing, consecutive minibatches).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.rollout.model import costmodel, trainer
from specdraft.rollout.model.workload import LengthModel, synthetic
from specdraft.rollout.schedule import dispatch, scheduler
from specdraft.spec.load import builtin_layout_text, load_layout_text


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--instances", type=int, default=64)
    parser.add_argument("--per-step", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = load_layout_text(builtin_layout_text("qwen3-8b"), [], source="<built-in qwen3-8b>")
    cost, train = costmodel.from_spec(spec), trainer.from_spec(spec)
    steps = -(-args.prompts // args.per_step)
    start = time.perf_counter()
    work = synthetic(LengthModel(cap=spec.rollout.max_response_length), steps, args.per_step, 8, 1024, seed=0)
    work[-1] = work[-1][: args.prompts - args.per_step * (steps - 1)]
    build_s = time.perf_counter() - start
    hint = dispatch.hint_from_cost(cost, 1, 64)
    mb = dispatch.minibatch_prompts(spec.training.global_batch_size, 8)
    total = sum(len(s) for s in work)
    base = timed(lambda: scheduler.build("fifo", work, args.instances, mb), args.repeats)
    asp = timed(lambda: scheduler.build("asp", work, args.instances, mb, hint=hint, trainer=train), args.repeats)
    print(
        f"{total:,} prompts x 8 samples over {args.instances} instances ({steps} steps; workload built in "
        f"{build_s:.2f} s)"
    )
    print(f"{'policy':<28} {'median s':>9} {'vs fifo':>9}")
    print(f"{'fifo (naive baseline)':<28} {base:>9.3f} {'1.00x':>9}")
    print(f"{'asp':<28} {asp:>9.3f} {asp / base:>8.2f}x")
    print(f"asp target: < 2 s -> {'met' if asp < 2.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
