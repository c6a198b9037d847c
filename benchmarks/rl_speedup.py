"""Speculative rollouts in GRPO: three arms of the real `grpo` workload on the same seeds, and their ratios.

Run: `.venv/bin/python benchmarks/rl_speedup.py [--seeds 0 1 2] [--steps 28] [--engine builtin|vllm] [--set KEY=VALUE
...] [--png PNG]`.
Per seed (training.seed) it launches the shipped layout grpo-tiny-cpu three times, single process
(`specdraft launch LAYOUT --workload grpo --executor local`, cluster.gpus_per_node=1 parallel.cp=1 parallel.pp=1),
the same grpo.sft_steps warm-up first, then RL on the same prompts:
  - none: draft.enabled=false, one target pass per token: the baseline of every ratio;
  - frozen: grpo.draft_mode=frozen, the draft trained in the warm-up, refit once as it ends, then fixed;
  - cotrain: grpo.draft_mode=cotrain, the draft co-trained on every step's forward and refit every step.
Each run's metrics.jsonl gives, per RL step, the reward, the engine's accept length and target forwards per
generated token, and the seconds generating, refitting and of the whole step. Prints the ratios against the
no-draft arm, and writes a PNG (and optionally the figures as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "layouts" / "grpo-tiny-cpu.yaml"
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]
ARMS = {"none": ["draft.enabled=false"], "frozen": ["grpo.draft_mode=frozen"], "cotrain": ["grpo.draft_mode=cotrain"]}


def launch(folder: Path, overrides: list[str], steps: int) -> list[dict]:
    """One run of the workload; its RL steps' rows of metrics.jsonl."""
    cli = Path(sys.executable).with_name("specdraft")
    argv = [str(cli), "launch", str(LAYOUT), *SINGLE, *overrides, "--workload", "grpo", "--steps", str(steps)]
    argv += ["--executor", "local", "--run-dir", str(folder)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=folder.parent)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [row_figures(r) for r in rows if r["phase"] == "grpo"]


def row_figures(r: dict) -> dict:
    e = r["engine"]
    return {
        "reward": r["reward_mean"],
        "accept_length": e["accept_length"],
        "acceptance_per_pos": e["acceptance_per_pos"],
        "forwards_per_token": e["num_target_forwards"] / max(e["num_generated_tokens"], 1),
        "generate_s": r["generate_s"],
        "train_s": r["train_s"],
        "refit_s": r["refit_s"],
        "step_s": r["step_time_s"],
        "draft_loss": r["draft_loss"],
    }


def summarize(results: dict[int, dict]) -> dict:
    def mean(arm: str, key: str, last: bool = False) -> float:
        return statistics.fmean(s[key] for r in results.values() for s in (r[arm][-1:] if last else r[arm]))

    out: dict = {"arms": {}}
    for arm in ARMS:
        a = {
            key: mean(arm, key)
            for key in ("accept_length", "forwards_per_token", "generate_s", "train_s", "step_s", "refit_s")
        }
        a["accept_length_first"] = statistics.fmean(r[arm][0]["accept_length"] for r in results.values())
        a["accept_length_last"] = mean(arm, "accept_length", last=True)
        a["refit_share"] = a["refit_s"] / a["step_s"]
        a["reward_last"] = mean(arm, "reward", last=True)
        out["arms"][arm] = a
    base = out["arms"]["none"]
    for arm in ("frozen", "cotrain"):
        a = out["arms"][arm]
        a["fewer_target_forwards_x"] = base["forwards_per_token"] / a["forwards_per_token"]
        a["rollout_wall_x"] = base["generate_s"] / a["generate_s"]
        a["step_wall_x"] = base["step_s"] / a["step_s"]
    # the no-draft arm's reward range over seeds, per step: is each draft arm's seed-mean inside it (+-0.02)?
    n = len(next(iter(results.values()))["none"])
    inside = {}
    for arm in ("frozen", "cotrain"):
        count = 0
        for i in range(n):
            base_rewards = [r["none"][i]["reward"] for r in results.values()]
            arm_mean = statistics.fmean(r[arm][i]["reward"] for r in results.values())
            count += min(base_rewards) - 0.02 <= arm_mean <= max(base_rewards) + 0.02
        inside[arm] = count / n
    out["reward_inside_none_spread"] = inside
    return out


def plot(results: dict[int, dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {"none": "tab:gray", "frozen": "tab:blue", "cotrain": "tab:red"}

    def seed_mean(arm: str, key: str) -> list[float]:
        return [statistics.fmean(v) for v in zip(*[[s[key] for s in r[arm]] for r in results.values()])]

    for arm in ARMS:
        per_seed = [[s["reward"] for s in r[arm]] for r in results.values()]
        steps = range(len(per_seed[0]))
        lo, hi = [min(v) for v in zip(*per_seed)], [max(v) for v in zip(*per_seed)]
        axes[0].plot(steps, seed_mean(arm, "reward"), color=colors[arm], label=arm)
        axes[0].fill_between(steps, lo, hi, color=colors[arm], alpha=0.15)
        if arm != "none":
            axes[1].plot(steps, seed_mean(arm, "accept_length"), color=colors[arm], label=arm)
        axes[2].plot(steps, seed_mean(arm, "forwards_per_token"), color=colors[arm], label=arm)
    axes[0].set(title="reward (seed mean, min-max band)", xlabel="RL step")
    axes[1].set(title="engine accept length (k=3)", xlabel="RL step")
    axes[2].set(title="target forwards per generated token", xlabel="RL step")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=28, help="all steps, the layout's 4 SFT warm-up steps included")
    parser.add_argument("--engine", choices=["builtin", "vllm"], default="builtin", help="grpo.engine of every arm")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="more KEY=VALUE layout overrides")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "rl_speedup.png")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="rl_speedup_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        results = {}
        for seed in args.seeds:
            results[seed] = {}
            for arm, extra in ARMS.items():
                overrides = [f"training.seed={seed}", f"grpo.engine={args.engine}", *extra, *args.overrides]
                results[seed][arm] = launch(root / f"seed{seed}-{arm}", overrides, args.steps)
                print(f"seed {seed} {arm}: {len(results[seed][arm])} RL steps", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    summary = summarize(results)
    print(f"{'arm':8} {'accept':>7} {'first':>6} {'last':>6} {'fwd/tok':>8} {'fwd x':>6} {'gen x':>6} {'step x':>7} "
          f"{'refit%':>7}")  # fmt: skip
    for arm, a in summary["arms"].items():
        print(
            f"{arm:8} {a['accept_length']:7.2f} {a['accept_length_first']:6.2f} {a['accept_length_last']:6.2f} "
            f"{a['forwards_per_token']:8.3f} {a.get('fewer_target_forwards_x', 1.0):6.2f} "
            f"{a.get('rollout_wall_x', 1.0):6.2f} {a.get('step_wall_x', 1.0):7.2f} {100 * a['refit_share']:6.2f}%"
        )
    print("reward at the last step:", {arm: round(a["reward_last"], 3) for arm, a in summary["arms"].items()})
    print(
        "share of steps whose seed-mean reward is inside the no-draft arm's seed range:",
        summary["reward_inside_none_spread"],
    )
    plot(results, args.png)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results, "args": vars(args)}, default=str))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
