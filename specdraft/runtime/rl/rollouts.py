"""What a rollout engine returns: the sampled responses and the counters of one generate call (engine.py re-exports
both; the engines import them from here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def prompt_seeds(seed: int | Sequence[int], num_prompts: int, num_generations: int) -> list[int]:
    """One sampling seed per prompt: ``seed`` itself when it lists them, else seed + i * num_generations. Sequence j
    of prompt i draws from seeds[i] + j (vLLM's rule for n > 1), so a prompt given the same seed samples the same
    whatever else is in the call, and the caller keeps prompts' seeds num_generations apart."""
    if isinstance(seed, int):
        return [seed + i * num_generations for i in range(num_prompts)]
    seeds = [int(s) for s in seed]
    if len(seeds) != num_prompts:
        raise ValueError(f"{len(seeds)} seeds for {num_prompts} prompts")
    return seeds


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
