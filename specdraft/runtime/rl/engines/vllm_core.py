"""The vLLM engine itself, run inside engines/vllm.py's child process: the HF policy folder, EAGLE-3 speculative
decoding through the draft folder, token-id prompts, acceptance from vLLM's counters, in-place refits through vLLM's
layerwise reload (model_loader/reload/inplace.py), and sleep mode on CUDA; serve() is the child's request loop."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from specdraft.runtime.rl import flat
from specdraft.runtime.rl.rollouts import GenerationStats, Rollout, prompt_seeds
from specdraft.runtime.serve.vllm_engine import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POS, spec_counters


class VllmCore:
    def __init__(
        self,
        policy_dir: Path,
        draft_dir: Path | None,
        *,
        k: int,
        eos_id: int | None,
        device: str,
        seed: int,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this (child) process
        from vllm import LLM

        self.k, self.eos_id = k, eos_id
        self.cuda = device.startswith("cuda")
        if not self.cuda:
            from specdraft.runtime.serve import vllm_cpu_fix

            vllm_cpu_fix.apply()
        self.draft = draft_dir is not None
        positions = json.loads((Path(policy_dir) / "config.json").read_text()).get("max_position_embeddings", 2048)
        self.llm = LLM(
            model=str(policy_dir),
            skip_tokenizer_init=True,
            dtype="auto" if self.cuda else "float32",
            seed=seed,
            # on CPU the share of *host* memory vLLM reserves for the KV cache
            gpu_memory_utilization=gpu_memory_utilization or (0.5 if self.cuda else 0.1),
            max_model_len=max_model_len or min(int(positions), 4096),
            enforce_eager=not self.cuda,
            disable_log_stats=False,
            enable_sleep_mode=self.cuda,
            speculative_config=(
                {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": k} if self.draft else None
            ),
        )
        self.asleep = False

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        seed: int | Sequence[int],
    ) -> tuple[list[Rollout], GenerationStats]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()
        before = spec_counters(self.llm)
        started = time.perf_counter()
        # vLLM refuses n > 1 when greedy: then each prompt goes in G times with n = 1 (the copies are identical)
        copies, n = (num_generations, 1) if temperature == 0 else (1, num_generations)
        seeds = prompt_seeds(seed, len(prompts), num_generations)
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                seed=seeds[i],  # vLLM seeds child j with seed + j: distinct over all sequences
                max_tokens=max_new_tokens,
                detokenize=False,
                ignore_eos=True,  # the model's own eos does not stop it; only eos_id does
                stop_token_ids=[self.eos_id] if self.eos_id is not None else None,
            )
            for i in range(len(prompts))
            for _ in range(copies)
        ]
        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(copies)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        after = spec_counters(self.llm)
        rollouts = []
        for r, out in enumerate(outputs):
            for completion in sorted(out.outputs, key=lambda c: c.index):
                tokens = tuple(int(t) for t in completion.token_ids)
                finished = self.eos_id is not None and self.eos_id in tokens
                rollouts.append(Rollout(r // copies, tokens, finished))
        return rollouts, self._stats(rollouts, before, after, seconds)

    def _stats(self, rollouts: list[Rollout], before: dict, after: dict, seconds: float) -> GenerationStats:
        def diff(name: str) -> int:
            return int(round(float(after.get(name, 0.0)) - float(before.get(name, 0.0))))

        per_pos = [
            int(round(a - b))
            for a, b in zip(after.get(PER_POS, [0.0] * self.k), before.get(PER_POS, [0.0] * self.k), strict=False)
        ]
        generated = sum(len(r.response) for r in rollouts)
        # vLLM counts no target passes: each sequence has its prefill, then one verify pass per draft (vLLM drafts
        # at every decode step), or one pass per further token without a draft
        forwards = len(rollouts) + diff(DRAFTS) if self.draft else generated
        return GenerationStats(
            num_generated_tokens=generated,
            num_target_forwards=forwards,
            num_drafts=diff(DRAFTS),
            num_draft_tokens=diff(DRAFT_TOKENS),
            num_accepted_tokens=diff(ACCEPTED),
            accepted_per_pos=tuple(per_pos) if self.draft else (0,) * self.k,
            seconds=seconds,
        )

    def _reload(self, weights: Iterable[tuple[str, torch.Tensor]], draft: bool) -> float:
        items = [(name, tensor.detach().cpu()) for name, tensor in weights]

        def reload(worker):  # runs in the worker (this process): vLLM's own in-place, layerwise reload
            from vllm.model_executor.model_loader.reload.inplace import reload_weights

            runner = worker.model_runner
            config = runner.vllm_config
            if draft:  # the drafter loads under its own model config (its architecture, its dtype)
                config = copy.copy(config)
                config.model_config = runner.vllm_config.speculative_config.draft_model_config
            model = runner.drafter.model if draft else runner.get_model()
            reload_weights(config, model, weights_iterator=iter(items), weights_path=None, is_checkpoint_format=True)

        self.wake_up()
        started = time.perf_counter()
        self.llm.collective_rpc(reload)
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        return time.perf_counter() - started

    def refit(self, names: Sequence[str], specs: Sequence[flat.Spec], buffer: torch.Tensor, *, draft: bool) -> float:
        """A refit as engines/vllm.py sends it (which refuses a draft refit without a draft): the tensors are views
        of one flat buffer."""
        return self._reload(zip(names, flat.views(buffer, specs)), draft=draft)

    def sleep(self) -> None:
        """CUDA, colocated with the trainer: free the KV cache and offload the weights while the policy trains
        (vLLM sleep level 1). A no-op on CPU, where vLLM has no sleep mode."""
        if self.cuda and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.cuda and self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        del self.llm
        import gc

        gc.collect()


def serve(conn: Any, env: dict[str, str], kwargs: dict[str, Any]) -> None:
    """The child's loop: open the engine under ``env`` (the trainer's environment without its torchrun variables),
    then answer (method, args, kwargs) requests with ("ok", value) or ("error", traceback) until "close"."""
    import traceback

    os.environ.clear()
    os.environ.update(env)
    try:
        engine = VllmCore(**kwargs)
    except BaseException:  # the parent raises it: a failed start must not leave the trainer waiting
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    conn.send(("ok", None))
    while True:
        method, args, call_kwargs = conn.recv()
        try:
            value = getattr(engine, method)(*args, **call_kwargs)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ok", value))
        if method == "close":
            conn.close()
            return
