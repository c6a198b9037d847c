"""What a launch starts from, checked before anything is written or submitted: the policy's checkpoint folder
(model.path), the imported draft (draft.path) and a user's reward module (grpo.reward)."""

from __future__ import annotations

import os

from specdraft.errors import Problem, SpecError, UserError
from specdraft.plan.model import LaunchPlan


def check_checkpoint(plan: LaunchPlan, dry_run: bool = False) -> tuple[dict | None, tuple[str, ...]]:
    """(the HF checkpoint the policy starts from, notes), checked against the plan's model (config.json and the
    safetensors headers, by the runtime's check payload: no torch) before anything is written or submitted; None
    when model.path is unset (random weights). A model.path that is no folder here (a hub id) or a folder without
    weights is refused, or with ``dry_run`` noted: the ranks read local weights and download nothing."""
    import json

    from specdraft.execute import payload
    from specdraft.plan.codec import encode_value
    from specdraft.spec.checkpoints.hf_config import weights_note

    path = plan.model.path
    if path is None:
        return None, ()
    if not os.path.isdir(os.path.expanduser(path)):
        if plan.model.config_sha256 is not None:  # compiled where the folder is: the ranks check it where they run
            return None, (f"model.path {path} is not on this machine; the ranks read it (and refuse it if absent)",)
        message = (
            f"model.path {path!r} is not a folder on this machine (a hub id?): the ranks read the policy's weights "
            "from a local Hugging Face folder and download nothing, so the policy would start from random weights"
        )
        fix = (
            f"download it first (e.g. `huggingface-cli download {path} --local-dir /ckpt/NAME`) and set "
            "model.path=/ckpt/NAME, or leave model.path unset to train from random weights"
        )
        if dry_run:
            return None, (f"{message}; a launch refuses it: {fix}",)
        raise UserError(message, fix)
    if not os.path.isabs(os.path.expanduser(path)):
        raise UserError(
            f"model.path {path!r} is a relative path, but the ranks run in the run folder, where it names "
            "something else",
            f"give the checkpoint folder as an absolute path: model.path={os.path.abspath(path)}",
        )
    note = weights_note(path)
    if note is not None:
        if dry_run:
            return None, (note,)
        raise UserError(
            f"model.path {path} holds config.json and no weights: neither model.safetensors nor "
            "model.safetensors.index.json (with its shards) is there, and a launch starts the policy from them",
            f"put the checkpoint's weights in {path} (e.g. `huggingface-cli download ORG/NAME --local-dir {path}`), "
            "or leave model.path unset to train from random weights; plan, validate, search, render and "
            "launch --dry-run take the config alone",
        )
    argv = ["--model", json.dumps(encode_value(plan.model)), "--path", path]
    return json.loads(payload.run("models.hf.check", argv, lambda line: None)), ()


def check_draft_checkpoint(plan: LaunchPlan) -> tuple[str, ...]:
    """draft.path's config.json against the plan before anything is written or submitted (a plan.json launch has
    not been through the layout's load-time check); returns its notes. The ranks check its tensors."""
    from specdraft.plan.draft_checkpoint import review

    _, findings, notes = review(plan)
    if findings:
        raise SpecError([Problem(path=f.field, value=f.value, rule=f.rule, fix=f.fix) for f in findings], "draft.path")
    return tuple(notes)


def check_reward(plan: LaunchPlan) -> None:
    """A `module:function` reward whose module this Python cannot find is refused before any rank starts (the
    ranks import it); the module is looked up, never imported."""
    from specdraft.spec.validate.grpo import reward_problem

    missing = reward_problem(plan.grpo.reward)
    if missing:
        raise SpecError([missing], "grpo.reward")


def check_grpo(plan: LaunchPlan) -> dict | None:
    """What the grpo workload needs before any rank starts: the plan's rollout instances, and every row of a prompt
    file rendered with the checkpoint's chat template, tokenised and checked to fit (the runtime's check payload).
    Returns the prompt check's summary, or None for a built-in task."""
    import json

    from specdraft.datafile import check_file
    from specdraft.execute import payload
    from specdraft.plan.codec import encode_value
    from specdraft.plan.grpo import prompt_limit

    if plan.rollout is None:
        raise UserError(
            "--workload grpo runs the plan's rollout instances, but this plan has none (its layout's workload is "
            f"{plan.workload!r} and rollout.enabled is false)",
            "set workload: grpo (or rollout.enabled: true) in the layout, then launch it",
        )
    if plan.data.path is None:
        return None
    check_file(plan.data.path, plan.data.format, plan.data.tokenizer)
    limit, why = prompt_limit(plan)
    argv = ["--data", json.dumps(encode_value(plan.data)), "--vocab", str(plan.model.vocab_size)]
    argv += ["--limit", str(limit), "--why", why, "--max-new", str(plan.grpo.max_new_tokens)]
    return json.loads(payload.run("rl.prompt_check", argv, lambda line: None))
