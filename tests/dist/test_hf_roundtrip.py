"""Import, train, export: a HF checkpoint launched through `specdraft launch` comes back out of `specdraft export
--policy` bit-identical, and transformers loads what specdraft wrote.

- A sharded fp32 Llama (index + 4 shards, tokenizer files) at tp2 with its padded vocabulary, and a bf16 Mixtral at
  ep2, each trained one step at lr 1e-30 (AdamW's first update is about lr: below half an ulp of every weight,
  so no weight moves) and saved; the export's tensors equal the input's exactly, names and dtypes included.
- The export is sharded at --max-shard-bytes with a consistent index, carries the input's config.json and
  tokenizer files, and transformers' forward of it equals its forward of the input.
- The run's draft export pairs with its policy export: vocabulary, hidden size and max_position_embeddings (the
  policy's 256, not the training seq_length 32) agree, and the aux ids are layers vLLM can capture.
- A run from random weights (at tp2: its padded vocabulary trimmed on the way out) exports a config.json made
  from the plan's model, and transformers' logits of that export equal specdraft's own model's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import SPECDRAFT_BIN
from tests.support import hf_models
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist
TRAIN = ["training.lr=1e-30", "training.save_interval=1", "training.warmup_steps=0", "cluster.gpus_per_node=2"]
ONE = ["parallel.cp=1", "parallel.pp=1", "parallel.sequence_parallel=false"]
SHARD_BYTES = 300_000


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(SPECDRAFT_BIN), *args], capture_output=True, text=True, timeout=400, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _launch(root: Path, name: str, overrides: list[str]) -> Path:
    run = root / f"run-{name}"
    steps = ["--workload", "cotrain", "--steps", "1", "--executor", "local", "--run-dir", str(run)]
    _run("launch", *overrides, *steps, cwd=root)
    return run


def _launch_and_export(root: Path, name: str, overrides: list[str], *export_args: str) -> dict:
    run = _launch(root, name, overrides)
    out = {"run": run, "policy": root / f"policy-{name}", "draft": root / f"draft-{name}"}
    _run("export", str(run), "--policy", "-o", str(out["policy"]), *export_args, cwd=root)
    _run("export", str(run), "-o", str(out["draft"]), cwd=root)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("roundtrip")
    llama = hf_models.make("llama", root / "llama", max_shard_size="200KB", tokenizer=True)
    mixtral = hf_models.make("mixtral", root / "mixtral", dtype=torch.bfloat16)
    llama_runs = {
        f"tp{tp}-{vocab}": _launch(
            root,
            f"llama-tp{tp}-{vocab}",
            hf_models.overrides(llama) + TRAIN + ONE + [f"parallel.tp={tp}", f"draft.vocab_size={vocab}"],
        )
        for tp, vocab in ((1, "null"), (1, 64), (2, 64))
    }
    return {
        "layouts": llama_runs,
        "llama": {
            "input": llama,
            **_launch_and_export(
                root,
                "llama",
                hf_models.overrides(llama) + TRAIN + ONE + ["parallel.tp=2"],
                "--max-shard-bytes",
                str(SHARD_BYTES),
            ),
        },
        "mixtral": {
            "input": mixtral,
            **_launch_and_export(
                root, "mixtral", hf_models.overrides(mixtral, "mixtral") + TRAIN + ONE + ["parallel.ep=2"]
            ),
        },
        "random": _launch_and_export(root, "random", [*hf_models.overrides(None), *TRAIN, *ONE, "parallel.tp=2"]),
    }


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_import_then_export_is_bit_identical(runs, kind):
    got, want = _tensors(runs[kind]["policy"]), _tensors(runs[kind]["input"])
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name].view(torch.uint8), value.view(torch.uint8)), name
    result = json.loads((runs[kind]["run"] / "results" / "rank-00000.json").read_text())
    assert result["policy_init"] == str(runs[kind]["input"]), "the policy started from the checkpoint"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("vocab", ["null", "64"])
def test_the_padded_vocabulary_changes_no_loss(runs, vocab):
    """The same model and data at tp1 (vocabulary 257) and tp2 (258 rows, one of them padding): the target's
    cross-entropy and the draft's KL (over the full vocabulary, or a reduced one of 64) are the same."""
    from tests.support.rank_procs import metrics

    tp2 = runs["llama"]["run"] if vocab == "null" else runs["layouts"]["tp2-64"]
    (one,), (two,) = metrics(runs["layouts"][f"tp1-{vocab}"]), metrics(tp2)
    for key in ("target_loss", "draft_loss"):
        assert two[key] == pytest.approx(one[key], rel=2e-5), key


@pytest.mark.timeout(900)
def test_the_export_is_a_sharded_checkpoint_transformers_loads(runs):
    src, out = runs["llama"]["input"], runs["llama"]["policy"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (out / "model.safetensors").exists()
    for shard in shards:
        held = [n for n, f in index["weight_map"].items() if f == shard]
        assert sorted(held) == sorted(_tensors_in(out / shard)), "the index names what each shard holds"
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in _tensors(out).values())
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    assert json.loads((out / "config.json").read_text()) == {
        **json.loads((src / "config.json").read_text()),
        "torch_dtype": "float32",
    }
    ids = hf_models.tokens()
    assert torch.equal(hf_models.reference_logits(out, ids), hf_models.reference_logits(src, ids))


def _tensors_in(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["llama", "random"])
def test_the_draft_export_pairs_with_the_policy_export(runs, kind):
    policy = json.loads((runs[kind]["policy"] / "config.json").read_text())
    draft = json.loads((runs[kind]["draft"] / "config.json").read_text())
    assert draft["vocab_size"] == policy["vocab_size"]
    assert draft["target_hidden_size"] == policy["hidden_size"]
    assert draft["max_position_embeddings"] == policy["max_position_embeddings"]
    assert draft["max_position_embeddings"] == (256 if kind == "llama" else 32)
    assert draft["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # the inputs of the layers after outputs 0, 1, 2
    assert all(1 <= i < policy["num_hidden_layers"] for i in draft["eagle_aux_hidden_state_layer_ids"])


def _specdraft_logits(rank, world_size, run_dir, ids):
    from specdraft.runtime.serve import offline

    plan = offline.read_run_plan(run_dir)
    folder, _ = offline.checkpoint(run_dir, None)
    with offline.single_process():
        target, _ = offline.load(plan, folder, draft=False, device=torch.device("cpu"), dtype=torch.float32)
        mb_row = hf_models.row(ids)
        from specdraft.runtime.train.batches import make_microbatch

        mb = make_microbatch(0, mb_row, cp=1, cp_rank=0, steps=1, device="cpu")
        with torch.no_grad():
            out = target(
                input_ids=mb.tokens[None],
                position_ids=mb.positions[None],
                attention_mask=None,
                packed_seq_params=mb.packed_seq_params(),
            )
    return out[0]


@pytest.mark.timeout(900)
def test_a_policy_trained_from_random_weights_exports_a_config_transformers_builds_the_same_model_from(runs):
    out = runs["random"]["policy"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == hf_models.VOCAB
    ids = hf_models.tokens()
    (want,) = run_distributed(_specdraft_logits, 1, runs["random"]["run"], ids, timeout=200)
    got = hf_models.reference_logits(out, ids)
    assert float((got - want).abs().max()) <= 1e-4
