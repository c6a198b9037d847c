"""The rollout engine's interface (sample G responses per prompt from the policy, with EAGLE-3 speculative decoding
through a draft when one is given, and report what it cost), the registry of engine kinds with their constructors,
and the one factory that opens an engine from its settings. New weights reach a running engine through the refit
of rl/instances/, never through this interface's arguments."""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from specdraft.runtime.rl.engines.config import EngineConfig
from specdraft.runtime.rl.rollouts import GenerationStats, Rollout

__all__ = ["ENGINES", "EngineConfig", "GenerationStats", "Rollout", "RolloutEngine", "open_engine"]


class RolloutEngine(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        seed: int | Sequence[int],
    ) -> tuple[list[Rollout], GenerationStats]:
        """num_generations responses per prompt, grouped by prompt (prompt 0's first); temperature 0 is greedy.
        ``seed``: one per prompt, or a base (rollouts.prompt_seeds); a prompt's samples depend on its seed alone."""
        ...

    def set_k_schedule(self, schedule: Sequence[tuple[int, int, int]]) -> None:
        """rollout.adaptive_k: from the next generate on, a running batch of b sequences drafts the k of the range
        (first, last, k) holding b, k 0 = no speculation (vLLM's num_speculative_tokens_per_batch_size); never more
        than the engine's k."""
        ...

    def sleep(self) -> None:
        """Colocated with the trainer: give the accelerator memory back while the policy trains; the next generate
        or refit wakes the engine (vLLM's sleep mode on CUDA; a no-op elsewhere)."""
        ...

    def close(self) -> None: ...


def _builtin(config: EngineConfig) -> RolloutEngine:
    from specdraft.runtime.rl.engines.builtin import BuiltinEngine

    # An instance of any rollout.tp runs on its lead's device alone (validate warns that the others idle).
    return BuiltinEngine(
        config.policy_dir, config.draft_dir, k=config.k, eos_id=config.eos_id, device=config.device, seed=config.seed
    )


def _vllm(config: EngineConfig) -> RolloutEngine:
    from specdraft.runtime.rl.engines.vllm import VllmEngine

    return VllmEngine(config)


# The engine kinds and their constructors; grpo.engine's Literal (spec/engines.py) lists the same kinds.
ENGINES: dict[str, Callable[[EngineConfig], RolloutEngine]] = {"builtin": _builtin, "vllm": _vllm}


def open_engine(kind: str, **settings) -> RolloutEngine:
    """The rollout engine ``kind`` (a key of ENGINES) opened with EngineConfig(**settings)."""
    if kind not in ENGINES:
        raise ValueError(f"rollout engine kind {kind!r}: expected one of {', '.join(ENGINES)}")
    return ENGINES[kind](EngineConfig(**settings))
