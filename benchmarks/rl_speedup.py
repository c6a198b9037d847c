"""Speculative rollouts in an RL loop: three arms on the same seeds, in one process, through the rollout engines.

Run: `.venv/bin/python benchmarks/rl_speedup.py [--seeds 0 1 2 3 4] [--rl-steps 16] [--engine builtin] [--png PNG]`.
Per seed: a tiny HF Llama policy (vocab 32) is SFT-warmed on a built-in verifiable task (continue x -> 3x + 1 mod
32 from a 4-token prompt; the reward is the share of response tokens that follow the rule), and an EAGLE-3 draft is
fitted to the warmed policy (runtime/rl/draft_fit.py, the TTT objective). Then GRPO steps run three ways from that
same start, on the same prompts:
  - none: rollouts without a draft (one target pass per token): the baseline of every ratio;
  - frozen: with the warm-up draft, never refit;
  - online: with the draft co-trained on each step's rollouts under the updated policy and refit every step.
Each step: generate (P prompts x G samples at temperature 1), score, train (one update of the GRPO loss with
group-normalised advantages; ratio 1 at one update per step, so the clip is inactive, and no KL term; plus the
draft's fit in the online arm), refit (policy, and draft when online, into the running engine).

This is the issue's fallback arm driver: a minimal in-benchmark policy update (plain torch on the HF model), not
`specdraft launch --workload grpo` (megatron under TP/CP/PP), whose spec has no knob yet for a draft frozen after
the SFT warm-up. Prints the ratios against the no-draft arm and writes the figures as JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB, PROMPT_LEN, ARMS = 32, 4, ("none", "frozen", "online")


def rule(x: int) -> int:
    return (3 * x + 1) % VOCAB


def reward(prompt: list[int], response: tuple[int, ...]) -> float:
    prev, good = prompt[-1], 0
    for token in response:
        good += token == rule(prev)
        prev = token
    return good / max(len(response), 1)


def prompts_for(seed: int, step: int, n: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed * 100003 + step)
    return torch.randint(0, VOCAB, (n, PROMPT_LEN), generator=g).tolist()


def sft(model, seed: int, steps: int, length: int) -> None:
    """Next-token loss on the rule's sequences, on the response part (the prompt is random)."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for step in range(steps):
        rows = []
        for p in prompts_for(seed + 7, step, 16):
            row = list(p)
            while len(row) < PROMPT_LEN + length:
                row.append(rule(row[-1]))
            rows.append(row)
        ids = torch.tensor(rows)
        logits = model(input_ids=ids).logits[:, PROMPT_LEN - 1 : -1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, PROMPT_LEN:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def grpo_update(model, optimizer, prompts, rollouts, rewards, generations: int) -> float:
    """One step of the GRPO loss, token-level mean over response tokens: -A * logp (ratio 1, no KL)."""
    import torch

    r = torch.tensor(rewards).view(-1, generations)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
    ids = torch.tensor([prompts[x.prompt_index] + list(x.response) for x in rollouts])
    logp = model(input_ids=ids).logits[:, PROMPT_LEN - 1 : -1].log_softmax(-1)
    token_logp = logp.gather(-1, ids[:, PROMPT_LEN:, None])[..., 0]  # (N, T)
    loss = -(adv[:, None] * token_logp).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def run_seed(seed: int, args, root: Path) -> dict:
    import torch
    import transformers

    from specdraft.runtime.rl import draft_fit
    from specdraft.runtime.rl.engine import open_engine
    from specdraft.runtime.rl.engines.eagle3_draft import load_folder
    from tests.support import rl_models

    folder = root / f"seed{seed}"
    base = rl_models.make_policy(folder / "init", seed=seed, vocab_size=VOCAB)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    sft(model, seed, args.sft_steps, args.max_new)
    model.save_pretrained(folder / "sft")
    draft_dir = rl_models.make_draft(folder / "draft", folder / "sft", seed=seed)
    draft = load_folder(draft_dir, "cpu")
    warm = open_engine(
        "builtin", policy_dir=folder / "sft", draft_dir=None, k=args.k, eos_id=None, device="cpu", seed=0
    )
    got, _ = warm.generate(prompts_for(seed + 3, 0, 32), num_generations=4, max_new_tokens=args.max_new,
                           temperature=1.0, seed=seed)  # fmt: skip
    sequences = torch.tensor([prompts_for(seed + 3, 0, 32)[r.prompt_index] + list(r.response) for r in got])
    draft_fit.fit(model, draft, sequences, k=args.k, steps=args.draft_steps, batch=32)
    rl_models.write_draft(draft_dir, draft.config, draft_fit.state(draft))
    arms = {}
    for arm in ARMS:
        policy = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "sft"), dtype=torch.float32)
        optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
        live = load_folder(draft_dir, "cpu")
        engine = open_engine(args.engine, policy_dir=folder / "sft", draft_dir=None if arm == "none" else draft_dir,
                             k=args.k, eos_id=None, device="cpu", seed=seed)  # fmt: skip
        steps = []
        for step in range(args.rl_steps):
            started = time.perf_counter()
            prompts = prompts_for(seed, 1000 + step, args.prompts)
            rollouts, stats = engine.generate(prompts, num_generations=args.generations, max_new_tokens=args.max_new,
                                              temperature=1.0, seed=seed * 1000 + step)  # fmt: skip
            rewards = [reward(prompts[r.prompt_index], r.response) for r in rollouts]
            train_started = time.perf_counter()
            grpo_update(policy, optimizer, prompts, rollouts, rewards, args.generations)
            if arm == "online":
                seqs = torch.tensor([prompts[r.prompt_index] + list(r.response) for r in rollouts])
                draft_fit.fit(policy, live, seqs, k=args.k, steps=args.online_draft_steps, batch=32)
            train_s = time.perf_counter() - train_started
            refit_s = engine.refit_policy((n, t.detach()) for n, t in policy.state_dict().items())
            if arm == "online":
                refit_s += engine.refit_draft(draft_fit.state(live).items())
            steps.append(
                {
                    "reward": statistics.fmean(rewards),
                    "accept_length": stats.accept_length,
                    "acceptance_per_pos": list(stats.acceptance_per_pos),
                    "forwards_per_token": stats.num_target_forwards / stats.num_generated_tokens,
                    "generate_s": stats.seconds,
                    "train_s": train_s,
                    "refit_s": refit_s,
                    "step_s": time.perf_counter() - started,
                }
            )
        engine.close()
        arms[arm] = steps
    return arms


def summarize(results: dict[int, dict]) -> dict:
    def mean(arm: str, key: str, last: bool = False) -> float:
        return statistics.fmean(s[key] for r in results.values() for s in (r[arm][-1:] if last else r[arm]))

    out: dict = {"arms": {}}
    for arm in ARMS:
        out["arms"][arm] = {
            key: mean(arm, key) for key in ("accept_length", "forwards_per_token", "generate_s", "step_s", "refit_s")
        }
        out["arms"][arm]["accept_length_last"] = mean(arm, "accept_length", last=True)
        out["arms"][arm]["refit_share"] = mean(arm, "refit_s") / mean(arm, "step_s")
        out["arms"][arm]["reward_last"] = mean(arm, "reward", last=True)
    base = out["arms"]["none"]
    for arm in ("frozen", "online"):
        a = out["arms"][arm]
        a["fewer_target_forwards_x"] = base["forwards_per_token"] / a["forwards_per_token"]
        a["rollout_wall_x"] = base["generate_s"] / a["generate_s"]
        a["step_wall_x"] = base["step_s"] / a["step_s"]
    # reward spread of the no-draft arm over seeds, per step: does each arm's seed-mean stay inside it?
    n = len(next(iter(results.values()))["none"])
    inside = {}
    for arm in ("frozen", "online"):
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
    colors = {"none": "tab:gray", "frozen": "tab:blue", "online": "tab:red"}
    for arm in ARMS:
        per_seed = [[s["reward"] for s in r[arm]] for r in results.values()]
        steps = range(len(per_seed[0]))
        mean = [statistics.fmean(v) for v in zip(*per_seed)]
        lo, hi = [min(v) for v in zip(*per_seed)], [max(v) for v in zip(*per_seed)]
        axes[0].plot(steps, mean, color=colors[arm], label=arm)
        axes[0].fill_between(steps, lo, hi, color=colors[arm], alpha=0.15)
        if arm != "none":
            acc = [statistics.fmean(v) for v in zip(*[[s["accept_length"] for s in r[arm]] for r in results.values()])]
            axes[1].plot(steps, acc, color=colors[arm], label=arm)
        fpt = [statistics.fmean(v) for v in zip(*[[s["forwards_per_token"] for s in r[arm]] for r in results.values()])]
        axes[2].plot(steps, fpt, color=colors[arm], label=arm)
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
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--engine", default="builtin", choices=("builtin", "vllm"))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=10)
    parser.add_argument("--draft-steps", type=int, default=150)
    parser.add_argument("--online-draft-steps", type=int, default=2)
    parser.add_argument("--rl-steps", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "rl_speedup.png")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # tiny ops: one intra-op thread is many times faster on a shared CPU
    root = Path(tempfile.mkdtemp(prefix="rl_speedup_"))
    try:
        results = {seed: run_seed(seed, args, root) for seed in args.seeds}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = summarize(results)
    print(f"{'arm':8} {'accept':>7} {'last':>6} {'fwd/tok':>8} {'fwd x':>6} {'gen x':>6} {'step x':>7} {'refit%':>7}")
    for arm, a in summary["arms"].items():
        print(
            f"{arm:8} {a['accept_length']:7.2f} {a['accept_length_last']:6.2f} {a['forwards_per_token']:8.3f} "
            f"{a.get('fewer_target_forwards_x', 1.0):6.2f} {a.get('rollout_wall_x', 1.0):6.2f} "
            f"{a.get('step_wall_x', 1.0):7.2f} {100 * a['refit_share']:6.2f}%"
        )
    print("reward at the last step:", {arm: round(a["reward_last"], 3) for arm, a in summary["arms"].items()})
    print(
        "share of steps whose seed-mean reward is inside the no-draft arm's seed range:",
        summary["reward_inside_none_spread"],
    )
    plot(results, args.png)
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "results": results, "args": vars(args)}, default=str, indent=1)
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
