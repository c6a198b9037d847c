"""HF checkpoints in, one process: the slice reader against safetensors' own slicing, the mapping's per-rank slices
(each HF value on exactly one tp rank; linear_qkv interleaved per query group), the vocabulary's padding kept out
of losses and argmaxes, the checkpoint checks (every problem named with its file and tensor), the launch-time
refusal through the CLI (exit 2, one message, nothing started) and the rule that pairs the two exports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.runtime.models.hf import mapping, reader
from specdraft.runtime.models.hf.checkpoint import CheckpointError, folder_of, open_checkpoint
from specdraft.spec.load import load_layout
from tests.conftest import SPECDRAFT_BIN
from tests.support import hf_models


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny sharded Llama (4 shards + index) with a tokenizer; tests copy it before breaking it."""
    return hf_models.make("llama", tmp_path_factory.mktemp("hf") / "llama", max_shard_size="200KB", tokenizer=True)


def _plan(folder: Path, *extra: str):
    return compile(load_layout(None, hf_models.overrides(folder) + list(extra)))


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_reader_reads_exactly_what_safetensors_slices(tmp_path, monkeypatch):
    from safetensors import safe_open
    from safetensors.torch import save_file

    monkeypatch.setattr(reader, "BLOCK_BYTES", 64)  # several row blocks per piece
    g = torch.Generator().manual_seed(0)
    tensors = {
        f"{kind}.{dtype}".replace("torch.", ""): torch.randn(shape, generator=g).to(dtype)
        for kind, shape in (("matrix", (37, 23)), ("vector", (29,)))
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    from specdraft.runtime.models.hf.checkpoint import HFCheckpoint, read_tensors

    found = HFCheckpoint(tmp_path, {}, "LlamaForCausalLM", read_tensors(tmp_path))
    cuts = {"matrix": [(None, None), ((5, 17), None), (None, (3, 11)), ((2, 30), (7, 22))], "vector": [((4, 21), None)]}
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as want, reader.Reader(found) as r:
        for name, value in tensors.items():
            for rows, cols in cuts[name.split(".")[0]]:
                piece = mapping.Piece(name, rows=rows, cols=cols)
                sliced = want.get_slice(name)
                r0, r1 = rows or (0, value.shape[0])
                expect = sliced[r0:r1] if value.dim() == 1 else sliced[r0:r1, slice(*cols) if cols else slice(None)]
                for dtype in (value.dtype, torch.float32):  # straight into the parameter, and through a conversion
                    before = r.bytes_read
                    dest = torch.full(expect.shape, float("nan"), dtype=dtype)
                    r.read(piece, dest)
                    assert torch.equal(dest, expect.to(dtype)), (name, rows, cols, dtype)
                    assert r.bytes_read - before == expect.numel() * value.element_size(), "only the slice's bytes"


def _megatron_names(g: mapping.Geometry) -> list[str]:
    """The GPTModel parameter names (global layers and experts) of geometry ``g``, local layer spec."""
    names = ["embedding.word_embeddings.weight", "output_layer.weight", "decoder.final_layernorm.weight"]
    for layer in range(g.shape.num_layers):
        p = f"decoder.layers.{layer}."
        names += [p + n for n in ("input_layernorm.weight", "pre_mlp_layernorm.weight")]
        names += [p + "self_attention.linear_qkv.weight", p + "self_attention.linear_proj.weight"]
        if g.family.moe:
            names.append(p + "mlp.router.weight")
            for e in range(g.shape.num_experts):
                names += [f"{p}mlp.experts.local_experts.{e}.linear_fc{i}.weight" for i in (1, 2)]
        else:
            names += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    return names


@pytest.mark.parametrize("kind", ["llama", "mixtral"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_hf_value_lands_on_exactly_one_tensor_parallel_rank(kind, tp):
    from specdraft.plan.compile import model_shape

    over = hf_models.overrides(Path("/nonexistent"), kind) + ["model.num_attention_heads=8", "model.num_query_groups=4"]
    shape = model_shape(load_layout(None, over))
    arch = {"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}[kind]
    g = mapping.Geometry(shape=shape, family=mapping.FAMILIES[arch], qk_norm=False)
    full = mapping.hf_tensors(g)
    counts = {name: torch.zeros(s, dtype=torch.int32) for name, s in full.items()}
    for rank in range(tp):
        for name in _megatron_names(g):
            source = mapping.source(name, g, mapping.Shard(tp, rank), mapping.Shard(tp, rank))
            for piece in source.pieces:
                r0, r1 = piece.rows or (0, full[piece.name][0])
                view = counts[piece.name][r0:r1]
                if piece.cols is not None:
                    view = view[:, piece.cols[0] : piece.cols[1]]
                view += 1
            if "word_embeddings" in name or "output_layer" in name:
                padded = mapping.padded_vocab(hf_models.VOCAB, tp)
                rows = sum(p.rows[1] - p.rows[0] for p in source.pieces) + source.pad_rows
                assert rows == padded // tp, "every rank holds Vp/tp rows, the last ones padding"
    for name, count in counts.items():
        whole = count.dim() == 1 or name.endswith("gate.weight")  # norms and the router are replicated
        assert torch.all(count == (tp if whole else 1)), name


def test_linear_qkv_is_interleaved_per_query_group():
    from specdraft.plan.compile import model_shape

    g = mapping.Geometry(
        shape=model_shape(load_layout(None, hf_models.overrides(Path("/x")))),
        family=mapping.FAMILIES["LlamaForCausalLM"],
        qk_norm=False,
    )
    d = g.shape.head_dim  # 16; 4 heads in 2 groups: 2 query heads per group
    source = mapping.source(
        "decoder.layers.3.self_attention.linear_qkv.weight", g, mapping.Shard(2, 1), mapping.Shard()
    )
    prefix = "model.layers.3.self_attn."
    assert source.pieces == (  # tp rank 1 of 2 holds group 1: [q heads 2, 3; k head 1; v head 1]
        mapping.Piece(prefix + "q_proj.weight", rows=(2 * d, 4 * d)),
        mapping.Piece(prefix + "k_proj.weight", rows=(d, 2 * d)),
        mapping.Piece(prefix + "v_proj.weight", rows=(d, 2 * d)),
    )
    fc1 = mapping.source("decoder.layers.0.mlp.linear_fc1.weight", g, mapping.Shard(2, 1), mapping.Shard())
    assert [(p.name.split(".")[-2], p.rows) for p in fc1.pieces] == [("gate_proj", (48, 96)), ("up_proj", (48, 96))]


def test_the_padded_vocabulary_takes_no_part_in_losses_or_argmax():
    from specdraft.runtime.models.vocab.parallel import argmax, log_softmax, mask_padding, vocab_parallel_kl

    g = torch.Generator().manual_seed(0)
    real = torch.randn(6, 5, generator=g)
    padded = torch.cat([real, torch.zeros(6, 3)], dim=-1).requires_grad_()  # zero rows give logit 0, not -inf
    masked = mask_padding(padded, vocab_size=5)
    assert torch.equal(argmax(masked), argmax(real))
    torch.testing.assert_close(log_softmax(masked)[:, :5], log_softmax(real), rtol=0, atol=1e-6)
    target = log_softmax(mask_padding(torch.cat([torch.randn(6, 5, generator=g), torch.zeros(6, 3)], -1), 5))
    kl = vocab_parallel_kl(masked, target)
    want = vocab_parallel_kl(real, target[:, :5])
    torch.testing.assert_close(kl, want, rtol=0, atol=1e-6)
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.all(padded.grad[:, 5:] == 0)
    ce = torch.nn.functional.cross_entropy(mask_padding(padded, 5), torch.arange(6) % 5)
    torch.testing.assert_close(ce, torch.nn.functional.cross_entropy(real, torch.arange(6) % 5))
    assert mask_padding(real, vocab_size=5) is real, "an unpadded shard is left alone"
    assert torch.all(mask_padding(torch.zeros(2, 4), vocab_size=5, rank=1)[:, 1:] == torch.finfo(torch.float32).min)


def _rewrite(folder: Path, change) -> None:
    """Apply ``change(tensors)`` to the whole state of the sharded ``folder``: tensors stay in their shards, new
    ones go to the first; the index follows."""
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    where = dict(index["weight_map"])
    tensors = {n: t for shard in shards for n, t in load_file(str(folder / shard)).items()}
    change(tensors)
    index["weight_map"] = {n: where.get(n, shards[0]) for n in tensors}
    for shard in shards:
        save_file({n: t for n, t in tensors.items() if index["weight_map"][n] == shard}, str(folder / shard))
    index_path.write_text(json.dumps(index))


def test_a_checkpoint_is_checked_before_anything_loads_with_every_problem_named(llama, tmp_path):
    plan = _plan(llama)
    assert open_checkpoint(plan.model, folder_of(plan.model.path)).architecture == "LlamaForCausalLM"

    broken = _copy(llama, tmp_path / "broken")

    def change(tensors):
        del tensors["model.embed_tokens.weight"]
        tensors["model.norm.weight"] = torch.ones(65)
        tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)

    _rewrite(broken, change)
    with pytest.raises(CheckpointError) as err:
        open_checkpoint(plan.model, broken)
    text = str(err.value)
    assert "3 problems" in text
    assert "'model.embed_tokens.weight' is missing (expected shape [257, 64])" in text
    assert "tensor 'model.norm.weight' has shape [65], the plan's model needs [64]" in text
    assert "tensor 'model.layers.0.self_attn.q_proj.bias' is not part of the model specdraft builds" in text
    assert "model-00003-of-00004.safetensors: tensor 'model.norm.weight'" in text, "the file is named"

    cut = _copy(llama, tmp_path / "cut")
    last = cut / "model-00004-of-00004.safetensors"
    last.write_bytes(last.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model-00004-of-00004.safetensors: tensor '.*' ends at byte"):
        open_checkpoint(plan.model, cut)

    # A layout whose MoE fields disagree with the dense config.json is refused by the spec, naming both.
    with pytest.raises(SpecError, match="model.num_experts = 4: disagrees with .*config.json"):
        _plan(llama, *hf_models.overrides(llama, "mixtral")[-4:])
    (tmp_path / "tokenizer-only").mkdir()
    assert folder_of(str(tmp_path / "tokenizer-only")) is None, "no weights: the layout's model, random weights"
    weights_only = _copy(llama, tmp_path / "weights-only")
    (weights_only / "config.json").unlink()
    with pytest.raises(CheckpointError, match="is a folder without config.json"):
        folder_of(str(weights_only))
    assert folder_of("meta-llama/Llama-3.1-8B") is None, "a hub id keeps random weights"


def _launch_dry(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    over = hf_models.overrides(folder) + ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1", *extra]
    return subprocess.run(
        [str(SPECDRAFT_BIN), "launch", *over, "--executor", "local", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder.parent if folder.is_absolute() else None,
    )


def test_launch_refuses_a_bad_checkpoint_with_one_message_before_any_rank_starts(llama, tmp_path):
    cases = {}
    arch = _copy(llama, tmp_path / "gpt2")
    config = json.loads((arch / "config.json").read_text())
    (arch / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    cases["arch"] = (arch, "GPT2LMHeadModel")  # refused by the spec, which reads config.json first
    shard = _copy(llama, tmp_path / "shard")
    (shard / "model-00002-of-00004.safetensors").unlink()
    cases["shard"] = (shard, "names shards that are not in")
    missing = _copy(llama, tmp_path / "missing")
    _rewrite(missing, lambda t: t.pop("model.norm.weight"))
    cases["missing"] = (missing, "tensor 'model.norm.weight' is missing (expected shape [64])")
    wrong = _copy(llama, tmp_path / "wrong")
    _rewrite(wrong, lambda t: t.update({"model.norm.weight": torch.ones(32)}))
    cases["shape"] = (wrong, "tensor 'model.norm.weight' has shape [32], the plan's model needs [64]")
    for name, (folder, message) in cases.items():
        proc = _launch_dry(folder)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert message in proc.stderr, (name, proc.stderr)
        assert str(folder) in proc.stderr, "the folder is named"
        assert "Traceback" not in proc.stderr and not (folder.parent / "runs").exists(), name
    ok = _launch_dry(llama)
    assert ok.returncode == 0, ok.stderr
    relative = _launch_dry(llama, f"model.path={llama.name}")  # run from the folder's parent
    assert relative.returncode == 2 and "is a relative path" in relative.stderr, relative.stderr


def test_the_policy_and_draft_exports_must_pair_in_vllm():
    from specdraft.runtime.folders import ExportError
    from specdraft.runtime.models.hf.export import check_pair

    policy = {"vocab_size": 257, "max_position_embeddings": 256, "hidden_size": 64, "num_hidden_layers": 4}
    draft = {
        "vocab_size": 257,
        "max_position_embeddings": 256,
        "target_hidden_size": 64,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    }
    check_pair(policy, draft)
    bad = {
        **draft,
        "max_position_embeddings": 32,
        "vocab_size": 256,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 4],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 3]},
    }
    with pytest.raises(ExportError) as err:
        check_pair(policy, bad)
    text = str(err.value.message)
    assert "the draft's vocab_size is 256 but the policy's vocab_size is 257" in text
    assert "the draft's max_position_embeddings is 32 but the policy's max_position_embeddings is 256" in text
    assert "include [4], which the policy's num_hidden_layers 4 cannot give" in text
