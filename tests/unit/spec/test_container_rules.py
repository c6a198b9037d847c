"""Container mode and memory rules (spec/validate/container.py): each refusal names the field, the value, the rule
and the fix, word for word as `specdraft validate` prints it."""

from __future__ import annotations

import pytest

from specdraft.assemble import check
from specdraft.spec.load import load_layout

NGC = "nvcr.io#nvidia/nemo-rl:v0.4.0"
CONTAINER = [f"slurm.container_image={NGC}", "slurm.container_specdraft=mount"]


def problems(overrides) -> dict[str, str]:
    errors, _ = check(load_layout(None, overrides))
    return {e.path: e.render() for e in errors}


@pytest.mark.parametrize(
    "image",
    [NGC, "nvidia/cuda:12.4.1-devel-ubuntu22.04", "ubuntu", "me@registry.example.com:5005#team/img:1.0", "/img.sqsh"],
)
def test_enroot_images_and_squashfs_paths_are_accepted(image):
    assert problems([f"slurm.container_image={image}", "slurm.container_specdraft=image"]) == {}


def test_a_registry_written_with_a_slash_is_refused_with_the_enroot_form():
    found = problems(["slurm.container_image=nvcr.io/nvidia/nemo-rl:v0.4.0", "slurm.container_specdraft=image"])
    assert found == {
        "slurm.container_image": (
            "slurm.container_image = 'nvcr.io/nvidia/nemo-rl:v0.4.0': names the registry 'nvcr.io' with '/': enroot "
            "separates the registry from the image with '#' ([USER@][REGISTRY#]IMAGE[:TAG]), so it would look for a "
            "Docker Hub image of that name; write slurm.container_image=nvcr.io#nvidia/nemo-rl:v0.4.0"
        )
    }


def test_a_scheme_and_a_bad_reference_are_refused():
    scheme = "slurm.container_image=docker://nvcr.io/nvidia/nemo-rl:v0.4.0"
    found = problems([scheme, "slurm.container_specdraft=image"])
    assert found["slurm.container_image"].endswith(
        "is a docker:// URI; pyxis takes enroot's [USER@][REGISTRY#]IMAGE[:TAG] without a scheme; "
        "write slurm.container_image=nvcr.io#nvidia/nemo-rl:v0.4.0"
    )
    bad = problems(["slurm.container_image=Has Spaces:x", "slurm.container_specdraft=image"])
    assert "must be enroot's [USER@][REGISTRY#]IMAGE[:TAG]" in bad["slurm.container_image"]


def test_an_image_needs_to_say_how_specdraft_gets_in():
    found = problems([f"slurm.container_image={NGC}"])
    assert found == {
        "slurm.container_specdraft": (
            "slurm.container_specdraft = None: must say how specdraft gets into slurm.container_image: every rank "
            "runs `python -m specdraft.runtime.entry` inside it, and an NGC image has no specdraft; set "
            "slurm.container_specdraft=mount (the script mounts the specdraft package this launch runs from) or "
            "=image (the image has this specdraft version installed)"
        )
    }
    assert problems(["slurm.container_specdraft=mount"]) == {}  # no image: nothing to get into


def test_mounts_must_be_absolute_and_hold_the_model_and_data():
    found = problems([*CONTAINER, "slurm.container_mounts=[/lustre:/l:ro,data:/d]", "model.path=/ckpt/llama"])
    assert found["slurm.container_mounts[1]"] == (
        "slurm.container_mounts[1] = 'data:/d': must be SRC:DST[:FLAGS] (or SRC alone, mounted at its own path) with "
        "absolute SRC and DST; e.g. /lustre/models:/models:ro"
    )
    assert found["model.path"] == (
        "model.path = '/ckpt/llama': must be visible inside the container: it lies under no DST of "
        "slurm.container_mounts; add a mount that holds it, e.g. slurm.container_mounts=[/ckpt:/ckpt:ro]"
    )
    assert problems([*CONTAINER, "slurm.container_mounts=[/lustre/ckpt:/ckpt:ro]", "model.path=/ckpt/llama"]) == {}
    assert problems([*CONTAINER, "slurm.container_mounts=[/ckpt]", "model.path=/ckpt/llama"]) == {}


@pytest.mark.parametrize("mem", ["0", "500G", "64000", "8g", "1T"])
def test_mem_takes_sbatch_sizes(mem):
    assert problems([f"slurm.mem={mem}"]) == {}


def test_bad_mem_and_two_memory_options_are_refused():
    assert problems(["slurm.mem=12X"]) == {
        "slurm.mem": (
            "slurm.mem = '12X': must be sbatch --mem's size: digits with an optional K, M, G or T (M when none); "
            "0 = all of a node; e.g. 500G, or 0 for the whole node"
        )
    }
    both = problems(["slurm.mem=500G", "slurm.extra_sbatch_args=[--mem-per-gpu=80G]"])
    assert both == {
        "slurm.extra_sbatch_args[0]": (
            "slurm.extra_sbatch_args[0] = '--mem-per-gpu=80G': sbatch takes one of --mem, --mem-per-cpu and "
            "--mem-per-gpu, and slurm.mem already renders --mem; keep slurm.mem and drop this option, or drop "
            "slurm.mem"
        )
    }


def test_executor_takes_local_or_slurm():
    assert problems(["cluster.executor=slurm"]) == {}
    with pytest.raises(Exception, match="cluster.executor"):
        load_layout(None, ["cluster.executor=kubernetes"])
