"""The drift experiment: a policy that keeps training while its data shifts, and three drafts measured by real
speculative decoding at every checkpoint.

Run: `.venv/bin/python benchmarks/drift.py [--out DIR] [--png docs/drift.png] [--prompts P] [OVERRIDES...]`.
One co-training run on one CPU process (the tiny layout, seed 2024) whose synthetic Markov chain moves
every `training.data_drift_interval` steps (a seeded half of the tokens get new successors each time); the policy
trains throughout, the draft joins after the warm-up and is co-trained online; a checkpoint every INTERVAL steps.
At each checkpoint step s the policy of step s decodes held-out prompts of the data it last trained on, greedily,
three ways, in one process:
  - online: speculative decoding with the draft of step s (co-trained next to the policy);
  - frozen: with the draft of the first shift's step (trained the same way until then, never after);
  - none: plain greedy decoding (one target forward per token: accept_len 1 by construction; its time is the
    baseline of the wall-clock ratios).
Every speculative run is checked lossless against plain decoding. Prints a table (accept_len per arm per step) and
writes the figures as JSON and the plot as PNG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS, WARMUP, SHIFT_EVERY, INTERVAL = 150, 20, 50, 10
# Seed 2024's chain (128 tokens) sends greedy paths into a few cycles of 5-10 tokens rather than one fixed point,
# so greedy decoding visits many tokens; the shifts then move half of every cycle's successors.
LAYOUT = [
    "cluster.gpus_per_node=1",
    "parallel.cp=1",
    "parallel.pp=1",
    "training.seed=2024",
    f"training.train_iters={STEPS}",
    f"training.warmup_steps={WARMUP}",
    f"training.data_drift_interval={SHIFT_EVERY}",
    "training.data_drift_fraction=0.5",
    f"training.save_interval={INTERVAL}",
    "training.keep_checkpoints=100",
]
K, PROMPT_LENGTH, MAX_NEW = 3, 8, 16


def train(run_dir: Path, overrides: list[str]) -> float:
    started = time.perf_counter()
    cli = Path(sys.executable).with_name("specdraft")
    proc = subprocess.run(
        [
            str(cli),
            "launch",
            *LAYOUT,
            *overrides,
            "--workload",
            "cotrain",
            "--executor",
            "local",
            "--run-dir",
            str(run_dir),
            "--force",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"training failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def measure(run_dir: Path, prompts: int) -> list[dict]:
    import torch

    from specdraft.runtime.serve import offline, speculative
    from specdraft.runtime.serve.measure import decode
    from specdraft.runtime.train.data import MarkovData

    plan = offline.read_run_plan(run_dir)
    t = plan.spec.training
    data = MarkovData.for_plan(plan)
    frozen_step = t.data_drift_interval
    rows = []
    with offline.single_process():
        device, dtype = offline.device_and_dtype(plan)
        frozen_folder, _ = offline.checkpoint(run_dir, frozen_step)
        _, frozen = offline.load(plan, frozen_folder, target=False, device=device, dtype=dtype)
        for step in range(t.warmup_steps + INTERVAL, t.train_iters + 1, INTERVAL):
            folder, _ = offline.checkpoint(run_dir, step)
            target, online = offline.load(plan, folder, device=device, dtype=dtype)
            drafts = {"online": online, "frozen": frozen if step > frozen_step else online}
            data_step = step - 1
            plain, spec = decode(
                plan,
                target,
                drafts,
                data_step=data_step,
                k=K,
                prompts=prompts,
                prompt_length=PROMPT_LENGTH,
                max_new=MAX_NEW,
                device=device,
            )
            row = {
                "step": step,
                "epoch": data.epoch(data_step),
                "none": {"accept_len": 1.0, "plain_s": sum(d.seconds for d in plain)},
            }
            for arm in drafts:
                row[arm] = speculative.summarize(plain, spec[arm], K)
            rows.append(row)
            print(
                f"step {step:4d} (data epoch {row['epoch']}): accept_len online {row['online']['accept_len']:.3f} "
                f"frozen {row['frozen']['accept_len']:.3f} none 1.000; lossless "
                f"{row['online']['lossless'] and row['frozen']['lossless']}",
                flush=True,
            )
            del target, online
            torch.manual_seed(0)
    return rows


def plot(rows: list[dict], path: Path, shift_every: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    for arm, style in (("online", "o-"), ("frozen", "s--"), ("none", ":")):
        ax.plot(
            steps,
            [r[arm]["accept_len"] for r in rows],
            style,
            label={
                "online": "draft co-trained online",
                "frozen": f"draft frozen at the first shift (step {shift_every})",
                "none": "no draft",
            }[arm],
        )
    for shift in range(shift_every, steps[-1], shift_every):
        ax.axvline(shift, color="grey", lw=0.8, alpha=0.6)
    ax.axvspan(0, WARMUP, color="grey", alpha=0.12, label="policy warm-up (no draft training)")
    ax.set_xlim(0, steps[-1] + 2)
    ax.set_ylim(0.9, K + 1.1)
    ax.set_xlabel("training step (data shifts at the grey lines)")
    ax.set_ylabel(f"measured accept_len (k = {K})")
    ax.set_title("Speculative decoding while the policy's data drifts (tiny CPU run, measured)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/drift"), help="the run folder (default runs/drift)")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "drift.png")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--reuse", action="store_true", help="measure an existing run folder without training")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    train_s = 0.0 if args.reuse else train(args.out.absolute(), args.overrides)
    started = time.perf_counter()
    rows = measure(args.out.absolute(), args.prompts)
    measure_s = time.perf_counter() - started
    from specdraft.fsutil import atomic_write_text

    atomic_write_text(
        args.out / "drift.json",
        json.dumps(
            {
                "layout": LAYOUT + args.overrides,
                "k": K,
                "prompt_length": PROMPT_LENGTH,
                "max_new_tokens": MAX_NEW,
                "prompts": args.prompts,
                "rows": rows,
            },
            indent=1,
        ),
    )
    plot(rows, args.png, SHIFT_EVERY)
    print(f"\ntraining {train_s:.0f} s, measuring {measure_s:.0f} s; wrote {args.out / 'drift.json'} and {args.png}")
    print("\n| step | data epoch | online accept_len | frozen accept_len | no draft | online wall x | frozen wall x |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['step']} | {r['epoch']} | {r['online']['accept_len']:.3f} | {r['frozen']['accept_len']:.3f} | "
            f"1.000 | {r['online']['speedup_wall']:.2f} | {r['frozen']['speedup_wall']:.2f} |"
        )


if __name__ == "__main__":
    main()
