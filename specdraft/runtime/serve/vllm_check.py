"""`specdraft render --to vllm --check`'s payload: vLLM itself validates the rendered engine settings.

`python -m specdraft.runtime.serve.vllm_check ENGINE_ARGS_JSON` builds vLLM's own configs from the render: always
ParallelConfig and CacheConfig, and, where the model (and the draft) are local folders, `EngineArgs(...)
.create_engine_config()`, which builds ModelConfig, SpeculativeConfig and the scheduler's config against the
checkpoints. A refusal is vLLM's own message (exit 2); so is a check that could not cover the model: never a pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from specdraft.errors import SpecdraftError, UserError


def _local(path: str | None) -> bool:
    return bool(path) and os.path.isfile(os.path.join(os.path.expanduser(str(path)), "config.json"))


def _vllm_says(what: str, build) -> None:
    try:
        build()
    except Exception as err:  # vLLM raises ValueError, pydantic's ValidationError, TypeError, OSError...
        text = " ".join(str(err).split())[:1500] or type(err).__name__
        raise UserError(
            f"vLLM refused the rendered settings ({what}): {text}", "fix the rollout section of the layout"
        ) from None


def check(engine_args: dict) -> dict:
    """What vLLM accepted; UserError with vLLM's message when it refuses, or when the model was out of reach."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a check never downloads a checkpoint
    import vllm
    from vllm.config import CacheConfig, ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    checked = []
    _vllm_says(
        "ParallelConfig",
        lambda: ParallelConfig(
            tensor_parallel_size=engine_args["tensor_parallel_size"],
            pipeline_parallel_size=engine_args["pipeline_parallel_size"],
        ),
    )
    checked.append("ParallelConfig")
    _vllm_says("CacheConfig", lambda: CacheConfig(gpu_memory_utilization=engine_args["gpu_memory_utilization"]))
    checked.append("CacheConfig")
    speculative = engine_args.get("speculative_config")
    missing = []
    if not _local(engine_args["model"]):
        missing.append(f"model {engine_args['model']!r} (model.path) is not a local folder with a config.json here")
    if speculative and not _local(speculative.get("model")):
        missing.append(
            f"speculative_config.model {speculative.get('model')!r} (draft.model) is not a local folder with a "
            "config.json here"
        )
    if missing:
        raise UserError(
            f"vLLM {vllm.__version__} accepted {' and '.join(checked)}, but could not check the model, "
            f"speculative_config or max_model_len: {'; '.join(missing)}",
            "run the check where the checkpoints are (model.path and draft.model as local folders), e.g. "
            "`specdraft render LAYOUT model.path=/ckpt/policy draft.model=/ckpt/draft --to vllm --check`",
        )
    _vllm_says("EngineArgs.create_engine_config", lambda: EngineArgs(**engine_args).create_engine_config())
    checked.append("EngineArgs.create_engine_config" + (" with SpeculativeConfig" if speculative else ""))
    return {"vllm": vllm.__version__, "checked": checked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdraft.runtime.serve.vllm_check")
    parser.add_argument("engine_args", help="the render's engine settings as JSON")
    args = parser.parse_args(argv)
    from specdraft.errors import payload_error_line

    try:
        result = check(json.loads(args.engine_args))
    except SpecdraftError as err:
        print(payload_error_line(getattr(err, "message", str(err)), getattr(err, "fix", "")), file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
