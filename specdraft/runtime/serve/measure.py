"""Measured speculative decoding of a run (`specdraft rollout measure`'s `python -m` payload): its target (the
policy) and draft loaded from its checkpoints on one process, plain greedy decoding and speculative decoding of the
same held-out prompts, timed in the same process; prints the figures as one JSON object. With --engine vllm the
same prompts and k go through vLLM serving the run's exports instead (vllm_engine.py), reported in the same terms.

Prompts are held-out sequences (data.MarkovData.prompt) of the distribution the policy's last trained step saw:
step N-1 for the checkpoint after N steps, which matters when the data drifts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdraft.plan.grpo import ENGINE_KINDS

DEFAULT_K = 3
DEFAULT_PROMPTS = 8
DEFAULT_PROMPT_LENGTH = 16
DEFAULT_MAX_NEW = 32


def check_args(k: int, prompts: int, prompt_length: int, max_new: int, engine: str = "builtin") -> None:
    from specdraft.runtime.folders import LoadError

    if engine not in ENGINE_KINDS:
        fix = "use " + " or ".join(f"--engine {kind}" for kind in ENGINE_KINDS)
        raise LoadError(f"--engine {engine!r} is not supported", fix)
    for option, value, what in (
        ("--k", k, "draft tokens per verify step"),
        ("--prompts", prompts, "prompts"),
        ("--prompt-length", prompt_length, "prompt tokens"),
        ("--max-new-tokens", max_new, "tokens to generate per prompt"),
    ):
        if value < 1:
            raise LoadError(
                f"{option} {value}: must be >= 1 ({what})", f"use e.g. {option} {DEFAULT_K if option == '--k' else 8}"
            )


def decode(
    plan, target, drafts: dict, *, data_step: int, k: int, prompts: int, prompt_length: int, max_new: int, device
) -> tuple[list, dict[str, list]]:
    """Greedy decoding and speculative decoding with each of ``drafts`` (arm -> draft) of ``prompts`` held-out
    prompts of ``data_step``'s distribution: (the greedy runs, {arm: its speculative runs})."""
    from specdraft.runtime.serve import speculative
    from specdraft.runtime.train.data import MarkovData

    data = MarkovData.for_plan(plan)
    engines = {arm: speculative.Engine(target, d, plan.draft.aux_layers, device) for arm, d in drafts.items()}
    first = next(iter(engines.values()))  # greedy decoding reads the target only
    first.forward(data.prompt(data_step, 0, prompt_length))  # warm-up: one-off kernel selection stays untimed
    plain, spec = [], {arm: [] for arm in engines}
    for i in range(prompts):  # interleaved, so every arm sees the same machine load
        prompt = data.prompt(data_step, i, prompt_length)
        plain.append(speculative.greedy(first, prompt, max_new))
        for arm, engine in engines.items():
            spec[arm].append(speculative.speculative(engine, prompt, max_new, k))
    return plain, spec


def measure_loaded(
    plan, target, draft, *, data_step: int, k: int, prompts: int, prompt_length: int, max_new: int, device
) -> dict:
    """Decode ``prompts`` held-out prompts of ``data_step``'s distribution both ways with loaded models."""
    import torch

    from specdraft.runtime.serve import speculative

    plain, spec = decode(
        plan,
        target,
        {"draft": draft},
        data_step=data_step,
        k=k,
        prompts=prompts,
        prompt_length=prompt_length,
        max_new=max_new,
        device=device,
    )
    out = speculative.summarize(plain, spec["draft"], k)
    out.update(
        greedy_tokens=[d.tokens for d in plain],
        prompt_length=prompt_length,
        max_new_tokens=max_new,
        data_step=data_step,
        device=str(device),
        dtype=str(next(draft.parameters()).dtype).removeprefix("torch."),
        threads=torch.get_num_threads(),
    )
    return out


def measure_run(
    run_dir: Path,
    *,
    step: int | None,
    draft_step: int | None,
    k: int,
    prompts: int,
    prompt_length: int,
    max_new: int,
    plan_sha256: str | None = None,
    engine: str = "builtin",
) -> dict:
    from specdraft.runtime.serve import offline

    check_args(k, prompts, prompt_length, max_new, engine)
    plan = offline.read_run_plan(run_dir, plan_sha256)
    offline.require_draft(plan, run_dir)
    need = prompt_length + max_new + k
    if need > plan.model.seq_length:
        raise offline.LoadError(
            f"--prompt-length {prompt_length} + --max-new-tokens {max_new} + --k {k} = {need} "
            f"tokens exceed the run's model.seq_length ({plan.model.seq_length}), the longest "
            "sequence its target and draft trained on",
            f"lower --max-new-tokens to {max(1, plan.model.seq_length - prompt_length - k)}",
        )
    if engine == "vllm":  # what vLLM cannot serve is refused before any checkpoint is read
        from specdraft.runtime.serve import vllm_engine

        vllm_engine.require_vllm()
        vllm_engine.require_servable(plan)
    target_folder, target_meta = offline.checkpoint(run_dir, step, "--step")
    offline.require_same_model(plan, target_folder, target_meta)
    target_step = int(target_meta["step"])
    if draft_step is None or draft_step == target_step:  # one checkpoint: checked (hashed) once
        draft_folder, draft_meta = target_folder, target_meta
    else:
        draft_folder, draft_meta = offline.checkpoint(run_dir, draft_step, "--draft-step")
        offline.require_same_model(plan, draft_folder, draft_meta)
    if engine == "vllm":
        from specdraft.runtime.serve.vllm_engine import measure as measure_engine
    else:
        measure_engine = _measure_builtin
    out = measure_engine(
        run_dir,
        plan,
        (target_folder, target_meta),
        (draft_folder, draft_meta),
        data_step=max(target_step - 1, 0),
        k=k,
        prompts=prompts,
        prompt_length=prompt_length,
        max_new=max_new,
    )
    out.update(
        engine=engine,
        run=str(run_dir),
        target_step=target_step,
        draft_step=int(draft_meta["step"]),
        draft_vocab_size=plan.draft.vocab_size,
        vocab_size=plan.model.vocab_size,
    )
    return out


def _measure_builtin(run_dir: Path, plan, target: tuple, draft: tuple, *, data_step: int, **decoding) -> dict:
    """The built-in engine (speculative.py) on the run's unsharded models, loaded in one gloo process."""
    from specdraft.runtime.serve import offline

    (target_folder, target_meta), (draft_folder, draft_meta) = target, draft
    with offline.single_process():
        device, dtype = offline.device_and_dtype(plan)
        if draft_folder == target_folder:
            target, draft = offline.load(plan, target_folder, device=device, dtype=dtype, meta=target_meta)
        else:
            target, _ = offline.load(plan, target_folder, draft=False, device=device, dtype=dtype, meta=target_meta)
            _, draft = offline.load(plan, draft_folder, target=False, device=device, dtype=dtype, meta=draft_meta)
        return measure_loaded(plan, target, draft, data_step=data_step, device=device, **decoding)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdraft.runtime.serve.measure", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run", type=Path)
    parser.add_argument("--step", type=int, default=None, help="the policy's checkpoint step (default: newest)")
    parser.add_argument("--draft-step", type=int, default=None, help="the draft's checkpoint step (default: --step)")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS)
    parser.add_argument("--prompt-length", type=int, default=DEFAULT_PROMPT_LENGTH)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW)
    parser.add_argument("--engine", default="builtin", help="builtin (speculative.py) or vllm")
    parser.add_argument("--plan-sha256", required=True, help="sha256 of the plan.json the CLI verified")
    args = parser.parse_args(argv)
    from specdraft.runtime.tool import run_tool

    return run_tool(
        lambda: measure_run(
            args.run.absolute(),
            step=args.step,
            draft_step=args.draft_step,
            k=args.k,
            prompts=args.prompts,
            prompt_length=args.prompt_length,
            max_new=args.max_new_tokens,
            plan_sha256=args.plan_sha256,
            engine=args.engine,
        )
    )


if __name__ == "__main__":
    from specdraft.runtime.tool import exit_now

    exit_now(main())
