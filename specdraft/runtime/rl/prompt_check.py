"""`python -m specdraft.runtime.rl.prompt_check --data JSON --vocab N --limit N --why TEXT --max-new N`: the launch-time
check of a GRPO prompt file (prompts.read_prompt_file: every row rendered with the checkpoint's chat template and
tokenised), run before any rank starts so that a row GRPO cannot use is one message and exit 2, never a job."""

from __future__ import annotations

import argparse
import json


def check(args) -> dict:
    from specdraft.plan.codec import decode
    from specdraft.plan.model import DataPlan
    from specdraft.runtime.rl.prompts import read_prompt_file

    def no_spec(data, where):
        raise ValueError(f"{where}: no spec inside a data section")

    data = decode(DataPlan, json.loads(args.data), "data", spec_decoder=no_spec)
    found = read_prompt_file(data, vocab=args.vocab, limit=args.limit, why=args.why, max_new=args.max_new)
    lengths = [len(r.tokens) for r in found.rows]
    return {"rows": len(found.rows), "format": found.format, "longest_prompt": max(lengths), "digest": found.digest}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdraft.runtime.rl.prompt_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", required=True, help="the plan's data section as JSON")
    parser.add_argument("--vocab", type=int, required=True, help="model.vocab_size")
    parser.add_argument("--limit", type=int, required=True, help="the longest prompt, in tokens")
    parser.add_argument("--why", required=True, help="what sets the limit (for the message)")
    parser.add_argument("--max-new", type=int, required=True, help="rollout.max_response_length")
    args = parser.parse_args(argv)
    from specdraft.runtime.tool import run_tool

    return run_tool(lambda: check(args))


if __name__ == "__main__":
    raise SystemExit(main())
