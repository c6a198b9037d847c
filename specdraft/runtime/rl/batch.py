"""A GRPO step's samples as the trainer's packed rows: prompt + response per sequence, the loss on the response
tokens, and each label's advantage in a (t,) tensor beside the row.

Every sequence is padded to one length L (the longest prompt + max_new_tokens, rounded up to the packing quantum;
model.seq_length with training.packing off, an unpacked batch), row_tokens // L of them per row in sample order.
Sample s (prompt-major: prompt s // G, its generation s % G) therefore sits in row s // (row_tokens // L), and data-
parallel rank d trains the samples of its num_microbatches rows: each rank builds only its own rows, from only its
own samples, and the rows never depend on the layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdraft.errors import UserError
from specdraft.runtime.train.data import LENGTH_QUANTUM, Row, pack_row


class GrpoLayoutError(UserError):
    """The step's samples do not fit the plan's rows."""


@dataclass(frozen=True)
class Sample:
    prompt: tuple[int, ...]
    response: tuple[int, ...]
    advantage: float = 0.0


def longest_sequence(plan, max_prompt_length: int) -> int:
    """The longest prompt + max_new_tokens, rounded up to the packing quantum."""
    quantum = math.lcm(LENGTH_QUANTUM, plan.parallel.pad_multiple)
    return -(-(max_prompt_length + plan.grpo.max_new_tokens) // quantum) * quantum


def sequence_length(plan, max_prompt_length: int) -> int:
    """Each sequence's padded length in a row: the longest sequence packed, or the model's whole sequence."""
    return longest_sequence(plan, max_prompt_length) if plan.training.packing else plan.model.seq_length


def rows_per_step(plan) -> int:
    return plan.num_microbatches * plan.parallel.dp


def per_row(plan, max_prompt_length: int) -> int:
    return plan.parallel.micro_batch_size * plan.model.seq_length // sequence_length(plan, max_prompt_length)


def rank_samples(plan, max_prompt_length: int, num_samples: int, dp_rank: int) -> range:
    """The samples data-parallel rank ``dp_rank`` trains (its rows' samples), in order."""
    share = plan.num_microbatches * per_row(plan, max_prompt_length)
    return range(min(num_samples, dp_rank * share), min(num_samples, (dp_rank + 1) * share))


def check_fits(plan, max_prompt_length: int, num_samples: int, what: str) -> None:
    """Refuse a plan whose rows cannot hold ``num_samples`` sequences (before any step runs)."""
    row_tokens = plan.parallel.micro_batch_size * plan.model.seq_length
    length = sequence_length(plan, max_prompt_length)
    fits = longest_sequence(plan, max_prompt_length) <= length
    capacity = row_tokens // length * rows_per_step(plan) if fits else 0
    if capacity < num_samples:
        raise GrpoLayoutError(
            f"a GRPO step has {num_samples} samples of {length} padded tokens ({what}, max_new_tokens "
            f"{plan.grpo.max_new_tokens}) but the plan's {rows_per_step(plan)} rows of {row_tokens} tokens hold "
            f"{capacity}",
            "raise training.global_batch_size or model.seq_length, or lower rollout.num_prompts_per_step, "
            "rollout.num_generations_per_prompt or rollout.max_response_length",
        )


def pack(samples: list[Sample], *, row_tokens: int, length: int, num_rows: int) -> tuple[list[Row], list[torch.Tensor]]:
    """(rows, per-row (t,) float64 advantages at label positions) for ``samples`` in order."""
    per_row = row_tokens // length
    rows, advantages = [], []
    for r in range(num_rows):
        chunk = samples[r * per_row : (r + 1) * per_row]
        sequences, adv = [], torch.zeros(row_tokens, dtype=torch.float64)
        at = 0
        for i, s in enumerate(chunk):
            content = torch.tensor((*s.prompt, *s.response), dtype=torch.long)
            trained = torch.zeros(len(content) - 1)
            trained[len(s.prompt) - 1 :] = 1.0  # labels index i predicts content[i + 1]: the response tokens
            padded = length if i < len(chunk) - 1 else row_tokens - at  # the row's last sequence takes the rest
            sequences.append((content, trained, padded))
            adv[at + len(s.prompt) - 1 : at + len(content) - 1] = s.advantage
            at += padded
        if not sequences:
            sequences = [(torch.zeros(1, dtype=torch.long), torch.zeros(0), row_tokens)]
        rows.append(pack_row(sequences))
        advantages.append(adv)
    return rows, advantages
