"""`python -m specdraft.runtime.models.hf.check --model JSON --path DIR`: the launch-time check of a HF checkpoint
against the plan's model (checkpoint.open_checkpoint), run before any rank starts so that a bad folder is one
message and exit 2, never a job. Reads config.json and the safetensors headers only; imports no torch."""

from __future__ import annotations

import argparse
import json


def check(model_json: str, path: str) -> dict:
    from specdraft.plan.codec import decode
    from specdraft.plan.model import ModelShape
    from specdraft.runtime.models.hf.checkpoint import folder_of, open_checkpoint

    def no_spec(data, where):
        raise ValueError(f"{where}: no spec inside a model section")

    model = decode(ModelShape, json.loads(model_json), "model", spec_decoder=no_spec)
    folder = folder_of(path)
    if folder is None:
        return {"checkpoint": None}
    found = open_checkpoint(model, folder)
    return {
        "checkpoint": str(folder),
        "architecture": found.architecture,
        "tensors": len(found.tensors),
        "bytes": sum(t.end - t.begin for t in found.tensors.values()),
        "dtype": found.dtype,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdraft.runtime.models.hf.check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="the plan's model section as JSON")
    parser.add_argument("--path", required=True, help="model.path")
    args = parser.parse_args(argv)
    from specdraft.runtime.tool import run_tool

    return run_tool(lambda: check(args.model, args.path))


if __name__ == "__main__":
    raise SystemExit(main())
