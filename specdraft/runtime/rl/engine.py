"""The rollout engine's interface: sample G responses per prompt from the policy, with EAGLE-3 speculative
decoding through a draft when one is given, report what it cost, and take new policy and draft weights in place."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

from specdraft.runtime.rl.rollouts import GenerationStats, Rollout

if TYPE_CHECKING:
    import torch

KINDS = ("builtin", "vllm")
__all__ = ["KINDS", "GenerationStats", "Rollout", "RolloutEngine", "open_engine"]


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

    def refit_policy(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load new policy weights (Hugging Face names) in place; returns the seconds taken."""
        ...

    def refit_draft(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load new draft weights (EAGLE-3 checkpoint names, as serve/eagle3.py writes them); returns seconds."""
        ...

    def sleep(self) -> None:
        """Colocated with the trainer: give the accelerator memory back while the policy trains; the next generate
        or refit wakes the engine (vLLM's sleep mode on CUDA; a no-op elsewhere)."""
        ...

    def close(self) -> None: ...


def open_engine(
    kind: str,
    *,
    policy_dir: Path,
    draft_dir: Path | None,
    k: int,
    eos_id: int | None,
    device: str,
    seed: int,
) -> RolloutEngine:
    """The rollout engine ``kind`` ("builtin" or "vllm") serving the HF folder ``policy_dir`` and, unless
    ``draft_dir`` is None, the EAGLE-3 folder ``draft_dir`` with k drafted tokens per step."""
    if kind == "builtin":
        from specdraft.runtime.rl.engines.builtin import BuiltinEngine

        return BuiltinEngine(policy_dir, draft_dir, k=k, eos_id=eos_id, device=device, seed=seed)
    if kind == "vllm":
        from specdraft.runtime.rl.engines.vllm import VllmEngine

        return VllmEngine(policy_dir, draft_dir, k=k, eos_id=eos_id, device=device, seed=seed)
    raise ValueError(f"rollout engine kind {kind!r}: expected one of {', '.join(KINDS)}")
