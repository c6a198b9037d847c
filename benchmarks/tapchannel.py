"""TapChannel's cost on this CPU: the pp=2 pipeline step against no draft, equal work and blocking sends.

Run: `.venv/bin/python benchmarks/tapchannel.py [--rounds N] [OVERRIDES...]`. One gloo world of 2 spawned ranks
(one per pipeline stage) builds four co-trainers of the same layout and runs their steps interleaved, round after
round, so every mode is timed under the same conditions in the same processes:
  - no draft: the pipeline alone (draft.enabled=false);
  - equal work: the draft runs on zero taps of the right shapes and nothing travels (pipeline + draft compute);
  - TapChannel: asynchronous isend/irecv on dedicated pair groups into landing slots;
  - blocking: dist.send inside the forward (NeMo-RL main's approach; receives pre-posted, else it deadlocks).
It prints median step times (max over the two ranks) and the ratios. TapChannel's overhead is its step over the
equal-work step: what moving the taps costs on top of the pipeline plus the draft.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support.distributed, the house harness
from tests.support.distributed import run_distributed

BASE = [
    "cluster.gpus_per_node=2",
    "parallel.cp=1",
    "parallel.pp=2",
    "model.hidden_size=256",
    "model.ffn_hidden_size=1024",
    "model.seq_length=512",
    "training.global_batch_size=8",
    "training.warmup_steps=0",
]
MODES = {  # name -> (extra overrides, environment read when the co-trainer is built)
    "no draft": (["draft.enabled=false"], {}),
    "equal work": ([], {"SPECDRAFT_TAPS_SYNTHETIC": "1"}),
    "TapChannel": ([], {}),
    "blocking": ([], {"SPECDRAFT_TAPS_BLOCKING": "1"}),
}


def _plans(overrides: list[str]) -> dict:
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return {mode: compile(load_layout(None, [*BASE, *overrides, *extra])) for mode, (extra, _) in MODES.items()}


def _worker(rank, world_size, plans, rounds, root):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime import cpu_compat
    from specdraft.runtime.context import RankContext
    from specdraft.runtime.train.trainer import CoTrainer
    from specdraft.runtime.workloads.cotrain import make_step

    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    cpu_compat.apply()
    steps, bytes_sent = {}, {}
    for mode, plan in plans.items():
        for key in ("SPECDRAFT_TAPS_SYNTHETIC", "SPECDRAFT_TAPS_BLOCKING"):
            os.environ.pop(key, None)
        os.environ.update(MODES[mode][1])
        ctx = RankContext(
            plan=plan,
            run_dir=Path(root),
            global_rank=rank,
            local_rank=rank,
            world_size=world_size,
            node=0,
            device="cpu",
            backend="gloo",
            steps=rounds,
            workload="cotrain",
        )
        trainer = CoTrainer(ctx)
        steps[mode] = (trainer, make_step(trainer))
    times = {mode: [] for mode in plans}
    for index in range(rounds):
        for mode, (trainer, step) in steps.items():
            dist.barrier()
            started = time.perf_counter()
            step(index)
            elapsed = torch.tensor([time.perf_counter() - started])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[mode].append(float(elapsed))
            bytes_sent[mode] = trainer.channel.bytes_sent
            trainer.channel.bytes_sent = 0
    return times, bytes_sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="warm-up rounds left out of the medians")
    parser.add_argument("overrides", nargs="*", help="extra layout overrides")
    args = parser.parse_args()
    plans = _plans(args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        results = run_distributed(_worker, 2, plans, args.rounds, tmp, timeout=3600)
    times, _ = results[0]
    sent = results[0][1]["TapChannel"] + results[1][1]["TapChannel"]
    med = {mode: statistics.median(t[args.skip :]) for mode, t in times.items()}
    print(f"layout: {' '.join([*BASE, *args.overrides])}")
    print(
        f"{args.rounds} rounds of the four modes interleaved; medians over the last {args.rounds - args.skip}; "
        f"TapChannel moves {sent:,} bytes per step"
    )
    print(f"{'mode':<12} {'step s':>8} {'vs no draft':>12} {'vs equal work':>14}")
    for mode in MODES:
        print(
            f"{mode:<12} {med[mode]:>8.3f} {med[mode] / med['no draft']:>11.3f}x "
            f"{med[mode] / med['equal work']:>13.3f}x"
        )
    print(f"TapChannel overhead over equal work: {med['TapChannel'] / med['equal work'] - 1:+.1%} (target <= 10%)")
    print(f"TapChannel step / blocking step: {med['TapChannel'] / med['blocking']:.3f}x (target <= 1)")


if __name__ == "__main__":
    main()
