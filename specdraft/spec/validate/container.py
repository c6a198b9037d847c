"""Rules of a containerised Slurm run (pyxis/enroot) and of its memory request: the image string's enroot form, how
specdraft gets into the image, mounts that make the model and data visible inside it, and `slurm.mem`.

Called by validate.validate_fields with its `err` collector. The run folder is mounted by the script itself (its
path is known only at launch, which checks it: execute/launch.py).
"""

from __future__ import annotations

import re

from specdraft.spec.schema import LayoutSpec

# sbatch --mem: a size with an optional unit (src/common/proc_args.c, str_to_mbytes); 0 = the whole node.
MEM_RE = re.compile(r"^(0|[1-9][0-9]{0,11})([KMGTkmgt])?$")
# enroot's image reference, as pyxis passes it on: [USER@][REGISTRY#]IMAGE[:TAG] (enroot import, "docker://" form).
ENROOT_IMAGE_RE = re.compile(
    r"^(?:[A-Za-z0-9._-]+@)?"  # USER@
    r"(?:[A-Za-z0-9.-]+(?::[0-9]{1,5})?#)?"  # REGISTRY[:PORT]#
    r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"  # IMAGE (path components)
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?$"  # :TAG
)
EXAMPLE_IMAGE = "nvcr.io#nvidia/nemo-rl:v0.4.0"


def image_problem(image: str) -> tuple[str, str] | None:
    """(rule, fix) when ``image`` is not something pyxis can start: an enroot reference or an absolute squashfs
    path; None when it is."""
    if image.startswith("/"):
        return None  # a squashfs file (enroot import's output) on the nodes
    if "://" in image:
        scheme, _, rest = image.partition("://")
        return (
            f"is a {scheme}:// URI; pyxis takes enroot's [USER@][REGISTRY#]IMAGE[:TAG] without a scheme",
            f"write slurm.container_image={_hashed(rest)}",
        )
    if "#" not in image:
        first, _, rest = image.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            # enroot would read the registry host as the first path component of a Docker Hub image.
            return (
                f"names the registry {first!r} with '/': enroot separates the registry from the image with '#' "
                "([USER@][REGISTRY#]IMAGE[:TAG]), so it would look for a Docker Hub image of that name",
                f"write slurm.container_image={_hashed(image)}",
            )
    if not ENROOT_IMAGE_RE.match(image):
        return (
            "must be enroot's [USER@][REGISTRY#]IMAGE[:TAG] (lower-case image path) or an absolute squashfs path",
            f"e.g. {EXAMPLE_IMAGE}, nvidia/cuda:12.4.1-devel-ubuntu22.04 or /shared/images/nemo-rl.sqsh",
        )
    return None


def _hashed(reference: str) -> str:
    first, _, rest = reference.partition("/")
    return f"{first}#{rest}" if rest and ("." in first or ":" in first or first == "localhost") else reference


def mount_target(mount: str) -> str | None:
    """The DST of a pyxis mount SRC[:DST[:FLAGS]] (SRC itself without DST); None when it is not absolute paths."""
    parts = mount.split(":")
    if len(parts) > 3 or not all(p.startswith("/") for p in parts[:2]):
        return None
    return parts[1] if len(parts) > 1 else parts[0]


def under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder if folder == "/" else folder + "/")


def container_rules(spec: LayoutSpec, err) -> None:
    s = spec.slurm
    if s.mem is not None and not MEM_RE.match(s.mem):
        err(
            "slurm.mem",
            s.mem,
            "must be sbatch --mem's size: digits with an optional K, M, G or T (M when none); 0 = all of a node",
            "e.g. 500G, or 0 for the whole node",
        )
    if s.mem is not None:
        for i, arg in enumerate(s.extra_sbatch_args):
            if re.match(r"^--mem(-per-cpu|-per-gpu)?(=|$)", arg):
                err(
                    f"slurm.extra_sbatch_args[{i}]",
                    arg,
                    "sbatch takes one of --mem, --mem-per-cpu and --mem-per-gpu, and slurm.mem already renders --mem",
                    "keep slurm.mem and drop this option, or drop slurm.mem",
                )
    if s.container_image is None or "\n" in s.container_image or not s.container_image.strip():
        return  # no container (a blank or multi-line image is validate.run's to report)
    problem = image_problem(s.container_image)
    if problem:
        err("slurm.container_image", s.container_image, *problem)
    if s.container_specdraft is None:
        err(
            "slurm.container_specdraft",
            None,
            "must say how specdraft gets into slurm.container_image: every rank runs `python -m "
            "specdraft.runtime.entry` inside it, and an NGC image has no specdraft",
            "set slurm.container_specdraft=mount (the script mounts the specdraft package this launch runs from) "
            "or =image (the image has this specdraft version installed)",
        )
    targets = []
    for i, mount in enumerate(s.container_mounts):
        target = mount_target(mount)
        if target is None:
            err(
                f"slurm.container_mounts[{i}]",
                mount,
                "must be SRC:DST[:FLAGS] (or SRC alone, mounted at its own path) with absolute SRC and DST",
                "e.g. /lustre/models:/models:ro",
            )
        else:
            targets.append(target)
    needed = [("data.path", spec.data.path)]
    if spec.model.path is not None and spec.model.path.startswith("/"):
        needed.append(("model.path", spec.model.path))
    for path, value in needed:
        if value is not None and value.startswith("/") and not any(under(value, t) for t in targets):
            err(
                path,
                value,
                "must be visible inside the container: it lies under no DST of slurm.container_mounts",
                f"add a mount that holds it, e.g. slurm.container_mounts=[{_parent(value)}:{_parent(value)}:ro]",
            )


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] or "/"
