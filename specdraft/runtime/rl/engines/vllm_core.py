"""The vLLM engine itself, run inside engines/vllm.py's child process: built by serve/vllm_llm.build_llm from the
engine arguments the proxy derived from the plan, EAGLE-3 speculative decoding through the draft, token-id prompts,
acceptance from vLLM's counters, refits received by its workers (engines/vllm_worker.py) over the refit groups and
loaded in place through vLLM's layerwise reload, and sleep mode on CUDA; serve() is the child's request loop, whose
pipe carries control messages only."""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Sequence

from specdraft.runtime.rl.rollouts import GenerationStats, Rollout, prompt_seeds
from specdraft.runtime.serve.vllm_engine import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POS, spec_counters


class VllmCore:
    def __init__(self, engine_args: dict[str, Any], *, k: int, eos_id: int | None):
        from specdraft.runtime.serve.vllm_llm import build_llm

        self.k, self.eos_id = k, eos_id
        self.draft = engine_args.get("speculative_config") is not None
        self.sleep_mode = bool(engine_args.get("enable_sleep_mode"))
        self.llm = build_llm(engine_args)
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

    def connect(self, links: list) -> None:
        """Every worker joins the refit groups of its senders (links: one (Rendezvous, {"policy": buckets,
        "draft": buckets}) per sending rank, in the order the senders send)."""
        self.llm.collective_rpc("specdraft_join", args=(links,))

    def receive(self, which: str) -> float:
        """One refit ("policy" or "draft"): every worker receives its senders' buckets and reloads in place; returns
        the seconds from the request to the reload's end."""
        if which == "draft" and not self.draft:
            raise ValueError("this engine was opened without a draft: there is none to refit")
        self.wake_up()
        started = time.perf_counter()
        self.llm.collective_rpc("specdraft_receive", args=(which,))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        return time.perf_counter() - started

    def set_k_schedule(self, schedule: list[tuple[int, int, int]]) -> None:
        """The scheduler's batch-size -> k lookup, rebuilt by vLLM's own builder from the (first, last, k) ranges
        (the engine core runs in this process: serve/vllm_llm.in_process_env). vLLM reads it at every step."""
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        if not self.draft:
            raise ValueError("this engine was opened without a draft: there is no k to choose")
        scheduler = self.llm.llm_engine.engine_core.engine_core.scheduler
        scheduler.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup(
            [list(r) for r in schedule],
            vllm_max_batch_size=scheduler.scheduler_config.max_num_seqs,
            vllm_num_speculative_tokens=scheduler.num_spec_tokens,
        )

    def sleep(self) -> None:
        """CUDA, colocated with the trainer: free the KV cache and offload the weights while the policy trains
        (vLLM sleep level 1). A no-op on CPU, where vLLM has no sleep mode."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.sleep_mode and self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        del self.llm
        import gc

        gc.collect()


def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` (the rank) dies, however it dies (Linux's PR_SET_PDEATHSIG; vLLM's own
    workers watch their parent the same way). Elsewhere the rank's close() alone ends the engine."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc Linux: no parent-death signal to ask for
        return
    libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the rank died before the signal was armed
        os._exit(1)


def serve(conn: Any, env: dict[str, str], kwargs: dict[str, Any], parent: int) -> None:
    """The child's loop: open the engine under ``env`` (the trainer's environment without its torchrun variables),
    then answer pickled (method, args, kwargs) requests with ("ok", value) or ("error", traceback) until "close"."""
    import traceback

    _die_with(parent)
    os.environ.clear()
    os.environ.update(env)

    def answer(message: tuple) -> None:
        conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    try:
        engine = VllmCore(**kwargs)
    except BaseException:  # the parent raises it: a failed start must not leave the trainer waiting
        answer(("error", traceback.format_exc()))
        conn.close()
        return
    answer(("ok", None))
    while True:
        method, args, call_kwargs = pickle.loads(conn.recv_bytes())
        try:
            value = getattr(engine, method)(*args, **call_kwargs)
        except BaseException:
            answer(("error", traceback.format_exc()))
            continue
        answer(("ok", value))
        if method == "close":
            conn.close()
            return
