"""The GRPO job's rollout instances on 4 CPU ranks (docs/grpo-rollouts.md, "Instances, dispatch and the bubble"):
one instance against two under fifo and under asp, on a prompt file whose reference answers are long-tailed (1-30
words), with the simulator's prediction for the same lengths and instances beside each measurement.

    .venv/bin/python benchmarks/rl_instances.py [--rl-steps 8] [--out FILE.json]

1. A tiny Llama-3-style checkpoint and tokenizer (tests/support/grpo_user.py) and 64 "repeat these words" prompts
   whose answers are 1-30 words (log-normal, median 4) are written; one process warms the policy up on the answers
   (grpo.sft_steps; its last checkpoint).
2. Each arm resumes that checkpoint on grpo-tiny-cpu's 4 ranks (pp2 dp2) and runs --rl-steps GRPO steps with the
   builtin engine: `one` (rollout.tp 4: one instance, on rank 0), `fifo` and `asp` (rollout.tp 2: two instances,
   on ranks 0 and 2). The draft is off, so what is measured is the dispatch, the bubble and the refit alone.
3. The builtin engine's decode step is measured here by (batch, context) on the warmed policy: the profile the
   simulator (rollout/sim/generation.py) runs on, with each arm's measured lengths and its dispatch policy.

Measured: the generate phase (the slowest instance's generate call), the bubble (the instances' idle seconds while
the slowest finishes), the refit and its share of the step. Ratios are against the `one` arm of the same run. The
simulator is shown raw and calibrated (an affine map fitted on the `one` arm's steps, applied to the others).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import grpo_user, hf_tokenizer  # noqa: E402

LAYOUT = ROOT / "layouts" / "grpo-tiny-cpu.yaml"
SPECDRAFT = Path(sys.executable).with_name("specdraft")
ROWS, PROMPTS, G, MAX_NEW, SEQ = 64, 16, 2, 40, 128
WARM_STEPS = 40
COMMON = [
    "model.seq_length=128",
    f"rollout.num_prompts_per_step={PROMPTS}",
    f"rollout.num_generations_per_prompt={G}",
    f"rollout.max_response_length={MAX_NEW}",
    f"rollout.prompt_length={SEQ - MAX_NEW}",
    "training.global_batch_size=32",
    "draft.enabled=false",
    "grpo.reward=tests.support.grpo_rewards:answer_in_text",
    f"grpo.sft_steps={WARM_STEPS}",
    "training.lr=3.0e-3",
]
ARMS = {
    "one": ["rollout.tp=4", "rollout.schedule=fifo"],
    "fifo": ["rollout.tp=2", "rollout.schedule=fifo"],
    "asp": ["rollout.tp=2", "rollout.schedule=asp"],
}


def write_prompts(path: Path, seed: int = 0) -> Path:
    """ROWS prompts 'repeat : w1 ... wn' answered by the n words: n log-normal (median 4, p99 ~ 30), 1..30."""
    rng = random.Random(seed)
    rows = []
    for _ in range(ROWS):
        n = max(1, min(30, round(math.exp(math.log(4) + 0.9 * rng.gauss(0, 1)))))
        words = [rng.choice(hf_tokenizer.WORDS) for _ in range(n)]
        rows.append({"prompt": "repeat : " + " ".join(words), "response": " ".join(words)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def launch(run: Path, overrides: list[str], steps: int, extra: list[str] = ()) -> None:
    argv = [str(SPECDRAFT), "launch", str(LAYOUT), *overrides, "--steps", str(steps), "--executor", "local"]
    argv += ["--run-dir", str(run), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=run.parent, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"launch failed ({run}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def rows_of(run: Path, phase: str = "grpo") -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("phase") == phase]


def samples_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rl" / "rollouts.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ the profile
def measure_profile(policy: Path, out: Path) -> Path:
    """The builtin engine's decode step on this CPU, one thread (as a rank runs): a forward over ``batch``
    right-padded sequences of ``context`` tokens, by (batch, context): the simulator's --profile CSV."""
    import torch

    from specdraft.runtime.rl.engines.builtin import BuiltinEngine

    torch.set_num_threads(1)
    engine = BuiltinEngine(policy, None, k=1, eos_id=None, device="cpu", seed=0)
    lines = ["tp,batch,context,decode_s"]
    for batch in (1, 2, 4, 8, 16, 32):
        for context in (16, 32, 64, 96, 128):
            rows = [[5] * context for _ in range(batch)]
            engine._forward(rows)  # warm
            reps, started = 3, time.perf_counter()
            for _ in range(reps):
                engine._forward(rows)
            seconds = (time.perf_counter() - started) / reps
            lines += [f"{tp},{batch},{context},{seconds:.6f}" for tp in (1, 2, 4)]
    out.write_text("\n".join(lines) + "\n")
    return out


def simulate(profile: Path, samples: list[dict], instances: int, dispatch: str) -> list[dict]:
    """Per RL step: the simulator's generation makespan and bubble for the measured lengths on ``instances``
    builtin instances (one device each), dispatched as the job did (round_robin for fifo, lpt for asp)."""
    from specdraft.assemble import compile
    from specdraft.rollout.model.costmodel import from_spec
    from specdraft.rollout.model.profile import ProfileCost, read_csv
    from specdraft.rollout.model.workload import Prompt
    from specdraft.rollout.sim.generation import GenConfig, simulate_generation
    from specdraft.spec.load import load_layout

    spec = compile(load_layout(LAYOUT, [*COMMON, "rollout.tp=1", "rollout.max_num_seqs=4096"])).spec
    tables = read_csv(profile)

    per = [1]  # samples per instance in the step being simulated

    class BuiltinCost(ProfileCost):
        """The builtin engine has no KV cache: its prefill is one forward over the instance's prompts (a decode step
        at the prompts' context, shared by the batch), and nothing is ever preempted."""

        def prefill(self, tp, tokens):
            a, b = self.affine(1, per[0], False, per[0] * tokens)
            return (a + b * per[0] * tokens) / per[0]

        def kv_capacity_tokens(self, tp):
            return 10**9

    cost = BuiltinCost.wrap(from_spec(spec), tables)
    samples_by_step: dict[int, list[dict]] = {}
    for s in samples:
        samples_by_step.setdefault(s["step"], []).append(s)
    out = []
    for step in sorted(samples_by_step):
        groups: dict[int, list[dict]] = {}
        for s in sorted(samples_by_step[step], key=lambda x: x["sample"]):
            groups.setdefault(s["sample"] // G, []).append(s)
        prompts = []
        for pid, group in sorted(groups.items()):
            lengths = [len(s["response_ids"]) for s in group]
            prompts.append(Prompt(pid, 0, len(group[0]["prompt_ids"]), lengths, [float(x) for x in lengths]))
        per[0] = max(1, sum(len(p.lengths) for p in prompts) // instances)
        cfg = GenConfig(cost=cost, gpus_per_node=instances, speculative_mode="off", dispatch=dispatch)
        result = simulate_generation(cfg, prompts, 1)
        out.append({"step": step, "makespan_s": result.makespan_s})
    return out


def summarize(run: Path) -> dict:
    rows = rows_of(run)
    gen = [max(i["busy_s"] for i in r["instances"]) for r in rows]  # the slowest instance: what the step waits for
    bubble = [statistics.mean(i["idle_s"] for i in r["instances"]) for r in rows]
    refit = [r["refit_s"] for r in rows]
    step = [r["step_time_s"] for r in rows]
    return {
        "per_step_generate_s": gen,
        "generate_s": statistics.median(gen),
        "bubble_s": statistics.median(bubble),
        "refit_s": statistics.median(refit),
        "step_s": statistics.median(step),
        "refit_share": statistics.median(r / s for r, s in zip(refit, step)),
        "reward": [round(r["reward_mean"], 4) for r in rows],
        "response_length": statistics.mean(r["response_length"] for r in rows),
        "instances": len(rows[0]["instances"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="rl-instances-"))
    root.mkdir(parents=True, exist_ok=True)
    model = grpo_user.make_model(root / "model") if not (root / "model" / "config.json").exists() else root / "model"
    prompts = write_prompts(root / "prompts.jsonl")
    user = [f"model.path={model}", f"model.vocab_size={grpo_user.VOCAB}", f"data.path={prompts}", *COMMON]
    warm = root / "warm"
    if not (warm / "checkpoints" / f"step-{WARM_STEPS}").exists():
        print(f"warm-up: {WARM_STEPS} SFT steps in one process", flush=True)
        launch(warm, [*user, "cluster.gpus_per_node=1", "parallel.pp=1"], WARM_STEPS)
    checkpoint = warm / "checkpoints" / f"step-{WARM_STEPS}"
    policy = root / "policy"
    if not (policy / "config.json").exists():
        subprocess.run([str(SPECDRAFT), "export", str(warm), "--policy", "-o", str(policy)], check=True, timeout=600)
    profile = measure_profile(policy, root / "profile.csv")
    results = {}
    for name, arm in ARMS.items():
        run = root / name
        print(f"arm {name}: {args.rl_steps} RL steps on 4 ranks", flush=True)
        launch(run, [*user, *arm], WARM_STEPS + args.rl_steps, ["--resume-from", str(checkpoint)])
        figures = summarize(run)
        instances = figures["instances"]
        sim = simulate(profile, samples_of(run), instances, "lpt" if name == "asp" else "round_robin")
        figures["per_step_simulated_s"] = [x["makespan_s"] for x in sim]
        figures["simulated_generate_s"] = statistics.median(x["makespan_s"] for x in sim)
        results[name] = figures
    # The profile times bare forwards; a generate call also samples, stops rows and moves tensors. One affine map
    # measured = a + b * simulated, fitted on the `one` arm's steps, calibrates the others (which it never saw).
    b, a = statistics.linear_regression(results["one"]["per_step_simulated_s"], results["one"]["per_step_generate_s"])
    for f in results.values():
        f["calibrated_generate_s"] = statistics.median(a + b * x for x in f["per_step_simulated_s"])
    one = results["one"]["generate_s"]
    print(f"\ncalibration on `one`: measured = {a:.3f} s + {b:.2f} x simulated")
    print(f"{'arm':6} {'inst':>4} {'generate s':>10} {'vs one':>7} {'simulated':>9} {'sim/meas':>8} {'calib/meas':>10} "
          f"{'bubble s':>8} {'refit s':>8} {'refit %':>7}")  # fmt: skip
    for name, f in results.items():
        print(
            f"{name:6} {f['instances']:>4} {f['generate_s']:>10.3f} {f['generate_s'] / one:>7.2f} "
            f"{f['simulated_generate_s']:>9.3f} {f['simulated_generate_s'] / f['generate_s']:>8.2f} "
            f"{f['calibrated_generate_s'] / f['generate_s']:>10.2f} "
            f"{f['bubble_s']:>8.3f} {f['refit_s']:>8.3f} {100 * f['refit_share']:>6.1f}%"
        )
    if args.out:
        calibration = {"intercept_s": a, "slope": b}
        args.out.write_text(
            json.dumps({"rl_steps": args.rl_steps, "calibration": calibration, "arms": results}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
