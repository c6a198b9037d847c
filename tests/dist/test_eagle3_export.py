"""The co-trained draft in use: the EAGLE-3 export, the drafts published while training, and measured lossless
speculative decoding, all from one real run (tp2 pp2, 4 ranks, a reduced draft vocabulary, unsorted aux layers).

- An independent reader (tests/support/eagle3_reader.py, float64, written from vLLM's and SpecForge's loaders) rebuilds
  the draft from config.json + model.safetensors and gives the runtime draft's logits for every TTT step.
- vLLM's load renames find every tensor with the shape its parameters have; config.json carries every key, and
  the aux layer ids in both conventions.
- The drafts published during training (live TP all-gather) equal the exports of the checkpoints at those steps
  (dist_checkpointing into an unsharded template), bit for bit.
- Speculative decoding always gives plain greedy decoding's tokens (trained draft, a scrambled one, several k);
  the decoder's chained drafting reproduces the TTT unroll the draft trained with.
- Bad input: no draft, no checkpoint, a missing --step / --draft-step, --k 0, a foreign -o folder: exit 2, by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.eagle3_reader import Eagle3Reader, vllm_param_name, vllm_param_shapes

pytestmark = pytest.mark.dist
AUX = [4, 1, 6]  # deliberately unsorted: the export puts fc's blocks in layer order
DRAFT_VOCAB = 48
LAYOUT = [
    "cluster.gpus_per_node=4",
    "parallel.tp=2",
    "parallel.cp=1",
    "parallel.pp=2",
    f"draft.aux_layers={AUX}",
    f"draft.vocab_size={DRAFT_VOCAB}",
    "training.warmup_steps=2",
    "training.save_interval=3",
    "draft.export_interval=3",
    "training.keep_checkpoints=5",
]
STEPS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import subprocess

    from tests.conftest import SPECDRAFT_BIN

    root = tmp_path_factory.mktemp("export")
    folder = root / "run"
    proc = subprocess.run(
        [
            str(SPECDRAFT_BIN),
            "launch",
            *LAYOUT,
            "--workload",
            "cotrain",
            "--steps",
            str(STEPS),
            "--executor",
            "local",
            "--run-dir",
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    export = root / "export-6"
    proc = subprocess.run(
        [str(SPECDRAFT_BIN), "export", str(folder), "--step", "6", "-o", str(export)],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 6" in proc.stdout and "d2t/t2d" in proc.stdout
    return folder, export


def _runtime_logits(rank, world, run_dir: str, length: int):
    """The runtime draft (loaded unsharded from step-6) on random taps and embeddings; plus the decoder's chained
    drafting, teacher-forced, against the same TTT unroll."""
    from specdraft.runtime.serve import offline
    from specdraft.runtime.serve.speculative import draft_chain

    plan = offline.read_run_plan(Path(run_dir))
    folder, _ = offline.checkpoint(Path(run_dir), 6)
    with offline.single_process():
        _, draft = offline.load(plan, folder, target=False)
        g = torch.Generator().manual_seed(7)
        steps, h = plan.spec.draft.ttt_steps, plan.model.hidden_size
        aux = torch.randn(len(AUX), length, h, generator=g)
        emb = torch.randn(steps, length, h, generator=g)
        positions = torch.stack([torch.arange(length) + j for j in range(steps)])
        cu = torch.tensor([0, length], dtype=torch.int32)
        with torch.no_grad():
            logits = [draft.head(x) for x in draft.ttt(aux, emb, positions, cu)]
            fed = iter(emb[1:, -1:])
            chain = draft_chain(draft, aux, emb[0], steps, lambda out: (out, next(fed, None)))
        return {
            "aux": aux,
            "emb": emb,
            "logits": logits,
            "chain": [c for c, _ in chain],
            "d2t": draft.vocab.d2t.clone(),
            "t2d": draft.vocab.t2d.clone(),
        }


def test_an_independent_reader_rebuilds_the_runtime_drafts_logits(run):
    folder, export = run
    got = run_distributed(_runtime_logits, 1, str(folder), 24, timeout=200)[0]
    reader = Eagle3Reader(export)
    assert torch.equal(reader.w("d2t"), got["d2t"]) and torch.equal(reader.w("t2d"), got["t2d"])
    expected = reader.ttt({layer: got["aux"][i] for i, layer in enumerate(AUX)}, got["emb"])
    for j, (want, mine) in enumerate(zip(expected, got["logits"])):
        placed = reader.target_logits(mine.double())  # the runtime's draft logits in vLLM's target-vocab layout
        assert torch.equal(torch.isinf(placed), torch.isinf(want)), j
        finite = torch.isfinite(want)
        assert torch.allclose(placed[finite], want[finite], rtol=1e-4, atol=1e-5), (
            j,
            (placed - want)[finite].abs().max(),
        )
        assert torch.equal(placed.argmax(-1), want.argmax(-1)), j
    # The decoder's chain (last row, teacher-forced) is the TTT unroll the draft trained with.
    for j, (chained, unrolled) in enumerate(zip(got["chain"], got["logits"])):
        assert torch.allclose(chained[0], unrolled[-1], rtol=1e-4, atol=1e-5), j
    # The draft vocabulary: sorted target ids, d2t offsets, t2d marks them.
    ids = torch.arange(DRAFT_VOCAB) + got["d2t"]
    assert torch.all(ids[1:] > ids[:-1]) and int(got["t2d"].sum()) == DRAFT_VOCAB and bool(got["t2d"][ids].all())


def test_vllm_renames_find_every_tensor_with_its_shape_and_config_has_every_key(run):
    from safetensors import safe_open

    _, export = run
    config = json.loads((export / "config.json").read_text())
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "draft_vocab_size",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
        "target_hidden_size",
    ):
        assert isinstance(config[key], (int, float)) and not isinstance(config[key], bool), key
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["vocab_size"] == 128 and config["norm_before_residual"] is False
    # vLLM: the ids name the layer whose input is captured (output of layer - 1); SGLang's eagle_config: outputs.
    assert config["eagle_aux_hidden_state_layer_ids"] == [a + 1 for a in sorted(AUX)]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == sorted(AUX)
    shapes = vllm_param_shapes(config)
    fused: dict[str, int] = {}
    seen = set()
    with safe_open(str(export / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        assert {"d2t", "t2d"} <= names
        for name in names:
            shape = tuple(handle.get_slice(name).get_shape())
            param, shard = vllm_param_name(name)
            if param is None:
                assert name == "t2d" and shape == (config["vocab_size"],)
                continue
            assert param in shapes, f"{name} -> {param}: vLLM has no such parameter"
            seen.add(param)
            if shard is None:
                assert shape == shapes[param], (name, shape, shapes[param])
            else:  # fused at load: the shards stack on dim 0, the input dim must match
                assert shape[1:] == shapes[param][1:], (name, shape)
                fused[param] = fused.get(param, 0) + shape[0]
    for param, rows in fused.items():
        assert rows == shapes[param][0], (param, rows, shapes[param])
    assert seen == set(shapes), f"vLLM parameters without a tensor: {set(shapes) - seen}"


def test_published_drafts_equal_the_checkpoint_exports(run, specdraft_cli, tmp_path):
    from safetensors.torch import load_file

    folder, export = run
    published = sorted(p.name for p in (folder / "draft").iterdir())
    assert published == ["step-3", "step-6"]
    proc = specdraft_cli("export", folder, "--step", "3", "-o", tmp_path / "e3", timeout=200)
    assert proc.returncode == 0, proc.stderr
    for step, exported in ((3, tmp_path / "e3"), (6, export)):
        live = load_file(str(folder / "draft" / f"step-{step}" / "model.safetensors"))
        saved = load_file(str(exported / "model.safetensors"))
        assert sorted(live) == sorted(saved)
        assert all(torch.equal(live[k], saved[k]) for k in live), step
        record = json.loads((folder / "draft" / f"step-{step}" / "specdraft-export.json").read_text())
        assert record["source"] == "training" and record["step"] == step
    # Exporting again over an earlier export replaces it (still whole); no temp folders stay behind.
    again = specdraft_cli("export", folder, "--step", "6", "-o", tmp_path / "e3", timeout=200)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "e3" / "specdraft-export.json").read_text())["step"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3"]


def _decode(rank, world, run_dir: str):
    from specdraft.runtime.serve import offline, speculative
    from specdraft.runtime.train.data import MarkovData

    plan = offline.read_run_plan(Path(run_dir))
    folder, _ = offline.checkpoint(Path(run_dir), 6)
    out = []
    with offline.single_process():
        target, draft = offline.load(plan, folder)
        data = MarkovData(vocab_size=128, row_tokens=64, pad_multiple=2, seed=plan.spec.training.seed)
        engine = speculative.Engine(target, draft, plan.draft.aux_layers, torch.device("cpu"))
        for scrambled in (False, True):
            if scrambled:  # a draft that mostly guesses wrong must still give the target's tokens
                g = torch.Generator().manual_seed(3)
                with torch.no_grad():
                    for p in draft.parameters():
                        p.add_(torch.randn(p.shape, generator=g) * 0.5)
            for i, k in enumerate((1, 3, 5)):
                prompt = data.prompt(5, i, 9)
                plain = speculative.greedy(engine, prompt, 12)
                spec = speculative.speculative(engine, prompt, 12, k)
                out.append((scrambled, k, plain.tokens, spec.tokens, spec.accepted, spec.target_forwards))
    return out


def test_speculative_decoding_is_lossless(run):
    folder, _ = run
    rows = run_distributed(_decode, 1, str(folder), timeout=300)[0]
    for scrambled, k, plain, spec, accepted, forwards in rows:
        assert spec == plain, (scrambled, k)
        assert all(0 <= a <= k for a in accepted) and forwards == 1 + len(accepted)
        assert sum(a + 1 for a in accepted) + 1 >= len(plain)  # every verify step adds its accepted drafts + 1
    assert any(a < k for scrambled, k, *_, accepted, _ in rows if scrambled for a in accepted), "scrambled draft"


def test_rollout_measure_reports_the_figures(run, specdraft_cli, tmp_path):
    folder, _ = run
    proc = specdraft_cli(
        "rollout",
        "measure",
        folder,
        "--draft-step",
        "3",
        "--prompts",
        "2",
        "--max-new-tokens",
        "8",
        "--format",
        "json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    for key in ("accept_len", "tokens_per_target_forward", "acceptance", "lossless", "speedup_wall", "k", "prompts"):
        assert key in r, key
    assert r["lossless"] is True and r["k"] == 3 and r["prompts"] == 2 and len(r["acceptance"]) == 3
    assert r["target_step"] == 6 and r["draft_step"] == 3
    assert r["accept_len"] == pytest.approx(1 + sum(r["acceptance"]), abs=1e-5)
    assert 1.0 <= r["tokens_per_target_forward"] <= r["accept_len"] + 1e-9
    assert r["speedup_wall"] > 0
    # The measured draft drives the rollout model.
    (tmp_path / "m.json").write_text(proc.stdout)
    sim = specdraft_cli(
        "rollout",
        "simulate",
        "--acceptance-from",
        tmp_path / "m.json",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--format",
        "json",
        timeout=200,
    )
    assert sim.returncode == 0, sim.stderr
    measured = json.loads(sim.stdout)["acceptance_from"]
    assert measured["kind"] == "decoding" and measured["k"] == 3
    assert measured["accept_len"] == pytest.approx(r["accept_len"])
    assert set(measured["speedup"]) >= {"asp", "fifo"}


def test_bad_input_is_refused_by_name(run, specdraft_cli, tmp_path):
    from tests.support.rank_procs import write_plan

    folder, _ = run
    proc = specdraft_cli("rollout", "measure", folder, "--k", "0")
    assert proc.returncode == 2 and "--k 0" in proc.stderr and "Traceback" not in proc.stderr
    proc = specdraft_cli("rollout", "measure", folder, "--draft-step", "99", timeout=120)
    assert proc.returncode == 2 and "--draft-step 99" in proc.stderr and "3, 6" in proc.stderr, proc.stderr
    proc = specdraft_cli("export", folder, "--step", "4", "-o", tmp_path / "x", timeout=120)
    assert proc.returncode == 2 and "--step 4" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not an export")
    proc = specdraft_cli("export", folder, "-o", foreign, timeout=120)
    assert proc.returncode == 2 and "not a specdraft export" in proc.stderr
    assert (foreign / "keep.txt").read_text() == "not an export"
    # A run folder without checkpoints, and one whose plan trains no draft.
    for name, overrides, message in (
        ("bare", LAYOUT, "no complete checkpoint"),
        ("nodraft", ["draft.enabled=false"], "trained no draft"),
    ):
        other = tmp_path / name
        other.mkdir()
        for item in (".specdraft-run", "run.json"):
            shutil.copy(folder / item, other / item)
        write_plan(other, overrides)
        for argv in (("export", other, "-o", tmp_path / f"{name}-out"), ("rollout", "measure", other)):
            proc = specdraft_cli(*argv, timeout=120)
            assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)
            assert "Traceback" not in proc.stderr


def test_an_export_into_a_read_only_folder_names_it_and_the_umask_is_kept(run, specdraft_cli, tmp_path):
    """The payload's OSError is the user's (exit 2, the path named), not an internal error; and the export made by
    the fixture (under this process's umask) is readable as that umask allows."""
    import os
    import stat

    from tests.support.filesystems import read_only_dir

    folder, export = run
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(export).st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(os.stat(export / "model.safetensors").st_mode) == 0o666 & ~umask
    with read_only_dir(tmp_path / "ro") as ro:
        proc = specdraft_cli("export", folder, "-o", ro / "draft", timeout=200)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot write the export {ro / 'draft'}" in proc.stderr and "internal error" not in proc.stderr
