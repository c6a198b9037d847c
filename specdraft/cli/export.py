"""`specdraft export RUN [--step N] [--policy] -o DIR`: a run's draft as an EAGLE-3 checkpoint vLLM and SGLang load,
or with --policy its policy as a Hugging Face checkpoint (thin; the work is runtime/serve/export.py, run in a
subprocess like launch runs the runtime)."""

from __future__ import annotations

from typing import Optional

import typer

from specdraft.cli.boundary import console as _console
from specdraft.cli.terminal import plain


def export_cmd(
    run: str = typer.Argument(..., metavar="RUN", help="A run folder's path, or its name under runs/."),
    step: Optional[int] = typer.Option(
        None, "--step", help="The checkpoint step to export (default: the newest complete one)."
    ),
    output: str = typer.Option(
        ...,
        "--output",
        "-o",
        metavar="DIR",
        help="The folder to write: config.json and "
        "model.safetensors (it appears whole; an earlier export there is replaced).",
    ),
    policy: bool = typer.Option(
        False,
        "--policy",
        help="Export the policy as a Hugging Face checkpoint (sharded safetensors, config.json, the tokenizer "
        "files of model.path) instead of the draft.",
    ),
    max_shard_bytes: Optional[int] = typer.Option(
        None, "--max-shard-bytes", min=1, help="--policy: the largest safetensors shard in bytes (default 5 GB)."
    ),
) -> None:
    """Write a run's draft as an EAGLE-3 checkpoint (config.json + model.safetensors) for vLLM and SGLang, or with
    --policy its policy as a Hugging Face checkpoint that transformers and vLLM load."""
    import json
    import os

    from specdraft.errors import UserError
    from specdraft.execute import monitor, payload
    from specdraft.fsutil import lstat_or_none
    from specdraft.runs.rundir import resolve_run

    folder, _, _ = resolve_run(run)
    # A name too long or a folder on the path that is a file is refused here, before torch starts.
    if lstat_or_none(output, "write the export") is not None and not os.path.isdir(output):
        raise UserError(f"-o {output} is a file; an export is a folder", "name a new folder")
    _, plan_sha256 = monitor.verified_plan(folder)  # the payload reads exactly these bytes
    payload.require_runtime("export")
    err = _console(stderr=True)
    argv = [str(folder), "-o", os.path.abspath(output), "--plan-sha256", plan_sha256]
    argv += ["--step", str(step)] if step is not None else []
    argv += _policy_argv(policy, max_shard_bytes)
    result = json.loads(payload.run("serve.export", argv, lambda line: err.print(plain(line), markup=False)))
    if policy:
        files = "model.safetensors" if result["shards"] == 1 else f"{result['shards']} safetensors shards + index"
        _console().print(
            f"wrote {result['output']}: {result['architecture']} config.json + {files} ({result['tensors']} "
            f"tensors, {result['bytes']:,} bytes {result['dtype']}) from {result['checkpoint']} "
            f"(step {result['step']})",
            markup=False,
        )
        return
    vocab = (
        f"draft vocabulary {result['draft_vocab_size']:,} of {result['vocab_size']:,} (d2t/t2d included)"
        if result["draft_vocab_size"] != result["vocab_size"]
        else f"vocabulary {result['vocab_size']:,}"
    )
    _console().print(
        plain(
            f"wrote {result['output']}: config.json + model.safetensors ({result['tensors']} tensors, "
            f"{vocab}) from {result['checkpoint']} (step {result['step']})"
        ),
        markup=False,
    )


def _policy_argv(policy: bool, max_shard_bytes: int | None) -> list[str]:
    from specdraft.errors import UserError

    if max_shard_bytes is not None and not policy:
        raise UserError("--max-shard-bytes applies to --policy exports", "add --policy, or drop --max-shard-bytes")
    if not policy:
        return []
    return ["--policy"] + (["--max-shard-bytes", str(max_shard_bytes)] if max_shard_bytes is not None else [])


def register(app) -> None:
    app.command("export")(export_cmd)
