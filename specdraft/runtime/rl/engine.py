"""The rollout engine's interface: sample G responses per prompt from the policy, with EAGLE-3 speculative
decoding through a draft when one is given, report what it cost, and take new policy and draft weights in place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

if TYPE_CHECKING:
    import torch

KINDS = ("builtin", "vllm")


@dataclass(frozen=True)
class Rollout:
    """One sampled response."""

    prompt_index: int  # index into the prompts passed to generate
    response: tuple[int, ...]  # generated token ids (eos included when hit)
    finished: bool  # eos hit before max_new_tokens


@dataclass(frozen=True)
class GenerationStats:
    """What one generate call cost. num_target_forwards counts per sequence (a batched pass over B sequences counts
    B): one per token without a draft, one per verify step with one, so generated / forwards is the speedup."""

    num_generated_tokens: int
    num_target_forwards: int
    num_drafts: int  # verify steps that carried drafts (vLLM's spec_decode_num_drafts)
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]  # [i]: drafts whose position i was accepted
    seconds: float

    @property
    def accept_length(self) -> float:
        """Tokens per verify step (accepted drafts + the bonus), NeMo-RL's and vLLM's figure."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_per_pos(self) -> tuple[float, ...]:
        return tuple(a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_pos)

    @property
    def tokens_per_target_forward(self) -> float:
        return self.num_generated_tokens / self.num_target_forwards if self.num_target_forwards else 0.0


class RolloutEngine(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> tuple[list[Rollout], GenerationStats]:
        """num_generations responses per prompt, grouped by prompt (prompt 0's first); temperature 0 is greedy."""
        ...

    def refit_policy(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load new policy weights (Hugging Face names) in place; returns the seconds taken."""
        ...

    def refit_draft(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load new draft weights (EAGLE-3 checkpoint names, as serve/eagle3.py writes them); returns seconds."""
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
