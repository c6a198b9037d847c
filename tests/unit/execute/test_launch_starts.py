"""What a launch starts from, checked before any rank starts, through the in-process CLI:

- a model.path folder holding only config.json (planning a cluster run from a model's config): plan, validate,
  search, render and launch --dry-run take it with a note; a real launch refuses it naming the missing weights
  (not the advice to re-save with save_pretrained, which is for .bin weights);
- a hub id in model.path: a real launch refuses it (the ranks download nothing: it would start from random
  weights), a dry run says so, and the ranks refuse a model.path that is no folder where they run;
- a shipped layout launched from a folder that holds a `model/` folder does not take it as its model;
- a `module:function` reward whose module cannot be found: `validate` and a grpo launch name it, before any rank
  starts, without importing (running) any user code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support import hf_models
from tests.support.cli import run_cli
from tests.support.paths import SHIPPED

transformers = pytest.importorskip("transformers")
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]


def config_only(folder: Path) -> Path:
    """The tiny Llama of tests/support/hf_models as its config.json alone (save_pretrained of the config class)."""
    transformers.LlamaConfig(**hf_models.COMMON).save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    return folder


def test_a_config_only_folder_plans_renders_and_dry_runs_with_a_note(tmp_path):
    folder = config_only(tmp_path / "llama")
    over = [*hf_models.overrides(folder), *SINGLE]
    note = f"note: model.path {folder} holds config.json and no weights"
    for argv in (("plan", *over), ("validate", *over), ("render", *over, "--to", "vllm"), ("search", *over)):
        proc = run_cli(*argv, cwd=tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr)
        assert note in " ".join(proc.stderr.split()), (argv, proc.stderr)
    megatron = run_cli("render", *over, "--to", "megatron", cwd=tmp_path)
    assert megatron.returncode == 0, megatron.stderr
    # its folder holds no tokenizer: the render leaves --tokenizer-model out and says so
    assert "--tokenizer-model" not in megatron.stdout.replace("--tokenizer-model FOLDER", "")
    # the note wraps at 110 columns wherever the temporary folder's length puts the breaks
    comments = " ".join(line.removeprefix("# ") for line in megatron.stdout.splitlines() if line.startswith("# "))
    assert "Not carried: the tokenizer (model.path" in comments and "holds no tokenizer files" in comments
    dry = run_cli("launch", *over, "--executor", "local", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "holds config.json and no weights" in " ".join(dry.stderr.split())
    assert not (tmp_path / "runs").exists()


def test_a_real_launch_of_a_config_only_folder_names_the_missing_weights(tmp_path):
    folder = config_only(tmp_path / "llama")
    proc = run_cli("launch", *hf_models.overrides(folder), *SINGLE, "--executor", "local", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert f"model.path {folder} holds config.json and no weights" in text
    assert "neither model.safetensors nor model.safetensors.index.json" in text
    assert "save_pretrained" not in text and "Traceback" not in text
    assert not (tmp_path / "runs").exists(), "nothing was written"


def test_the_ranks_name_missing_weights_and_refuse_a_model_path_that_is_no_folder(tmp_path):
    from specdraft.assemble import compile
    from specdraft.runtime.models.hf.checkpoint import CheckpointError, plan_checkpoint
    from specdraft.spec.load import load_layout

    folder = config_only(tmp_path / "llama")
    with pytest.raises(CheckpointError) as err:
        plan_checkpoint(compile(load_layout(None, hf_models.overrides(folder))))
    assert "holds config.json and no weights" in str(err.value) and "save_pretrained" not in str(err.value)
    (folder / "pytorch_model.bin").write_bytes(b"")  # weights of another format: that advice is the right one
    with pytest.raises(CheckpointError, match=r"save_pretrained\(safe_serialization=True\)"):
        plan_checkpoint(compile(load_layout(None, hf_models.overrides(folder))))
    hub = compile(load_layout(None, ["model.path=meta-llama/Llama-3.1-8B"]))
    with pytest.raises(CheckpointError, match="is not a folder on this node.*random weights"):
        plan_checkpoint(hub)
    assert plan_checkpoint(compile(load_layout(None))) is None, "no model.path: random weights, by request"


def test_a_hub_id_is_refused_at_launch_and_noted_by_a_dry_run(tmp_path):
    # The tiny layout with a hub id: were the refusal gone, this would start one cheap rank from random weights.
    hub = ["tiny-cpu", *SINGLE, "model.path=meta-llama/Llama-3.1-8B"]
    launch = run_cli("launch", *hub, "--executor", "local", cwd=tmp_path)
    assert launch.returncode == 2
    text = " ".join(launch.stderr.split())
    assert "model.path 'meta-llama/Llama-3.1-8B' is not a folder on this machine" in text
    assert "random weights" in text and "huggingface-cli download meta-llama/Llama-3.1-8B" in text
    assert not (tmp_path / "runs").exists()
    layout = [str(SHIPPED / "llama3.1-8b-pat.yaml")]  # model.path: meta-llama/Llama-3.1-8B
    dry = run_cli("launch", *layout, "--executor", "slurm", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "a launch refuses it" in " ".join(dry.stderr.split())
    # planning and rendering a hub id is what it is for
    assert run_cli("render", *layout, "--to", "vllm", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("layout", ["tiny-cpu", "grpo-tiny-cpu"])
def test_a_shipped_layout_ignores_a_model_folder_in_the_current_directory(tmp_path, layout):
    hf_models.make("llama", tmp_path / "model")  # a whole checkpoint, where the old default path pointed
    proc = run_cli("launch", layout, *SINGLE, "--executor", "local", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "relative path" not in proc.stderr
    plan = json.loads(run_cli("plan", layout, "--format", "json", cwd=tmp_path).stdout)
    assert plan["model"]["path"] is None and plan["model"]["config_sha256"] is None, "model/config.json unread"


def test_a_reward_module_that_cannot_be_found_is_named_before_any_rank_starts(tmp_path):
    grpo = [str(SHIPPED / "grpo-tiny-cpu.yaml"), *SINGLE[:1], "parallel.pp=1"]
    missing = run_cli("validate", *grpo, "grpo.reward=no_such_rewards.sub:score", cwd=tmp_path)
    assert missing.returncode == 2
    assert "grpo.reward = 'no_such_rewards.sub:score'" in missing.stderr
    assert "no module 'no_such_rewards.sub'" in missing.stderr and "PYTHONPATH" in missing.stderr
    launch = run_cli("launch", *grpo, "grpo.reward=no_such_rewards:score", "--executor", "local", cwd=tmp_path)
    assert launch.returncode == 2 and "no module 'no_such_rewards'" in launch.stderr
    assert not (tmp_path / "runs").exists(), "refused before any rank started"
    # A package that is there is looked up, never imported: its __init__ would leave a mark.
    package = tmp_path / "lib" / "my_rewards"
    package.mkdir(parents=True)
    mark = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    (package / "score.py").write_text("def score(prompt, response, info):\n    return 1.0\n")
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        found = run_cli("validate", *grpo, "grpo.reward=my_rewards.score:score", cwd=tmp_path)
        assert found.returncode == 0, found.stderr
        gone = run_cli("validate", *grpo, "grpo.reward=my_rewards.nothing:score", cwd=tmp_path)
        assert gone.returncode == 2 and "no module 'my_rewards.nothing'" in gone.stderr
    finally:
        sys.path.remove(str(tmp_path / "lib"))
    assert not mark.exists(), "validate ran the package's code"
    assert "my_rewards" not in sys.modules
