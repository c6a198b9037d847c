"""Deterministic synthetic training data: packed microbatches from a seeded sparse Markov chain.

Every rank generates the same global batch from (seed, step, row), so any layout sees identical data (the
parity tests rely on it) and no hub download is needed. The chain is learnable (each token has three likely
successors), so the target's loss falls and the draft's acceptance rises within a few dozen steps. With
training.data_drift_interval = M the transitions shift every M steps (a seeded share of the tokens get new
successors), standing in for the data of a policy that keeps changing; off, the data is exactly as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUCCESSOR_PROBS = (0.9, 0.08, 0.02)
LENGTH_QUANTUM = 16  # sequence lengths are multiples of this (and of the plan's CP padding multiple)
# Seed namespaces of the drift shifts and of held-out prompts, apart from the training rows' (seed, step, row).
DRIFT_SEED = 0x5D21F7
PROMPT_SEED = 0x9E3779B9


@dataclass(frozen=True)
class Row:
    """One packed row (a microbatch's global tokens, before CP sharding)."""

    tokens: torch.Tensor  # (t,) int64
    labels: torch.Tensor  # (t,) next token in the same sequence, 0 where none
    loss_mask: torch.Tensor  # (t,) float, 0 on padding and on each sequence's last token
    positions: torch.Tensor  # (t,) position within its sequence
    cu_seqlens: torch.Tensor  # (n+1,) int64, global


def pack_row(sequences: list[tuple[torch.Tensor, torch.Tensor, int]]) -> Row:
    """One packed row from (tokens (n,), loss mask (n-1,) over the labels tokens[1:], padded length) per sequence:
    each sequence zero-padded to its length, labels shifted by one, positions restarting at 0."""
    tokens, labels, mask, positions = [], [], [], []
    for content, trained, length in sequences:
        n = len(content)
        seq = torch.zeros(length, dtype=torch.long)
        seq[:n] = content
        lab = torch.zeros(length, dtype=torch.long)
        lab[: n - 1] = content[1:]
        m = torch.zeros(length)
        m[: n - 1] = trained
        tokens.append(seq)
        labels.append(lab)
        mask.append(m)
        positions.append(torch.arange(length))
    cu = torch.tensor([0] + [length for _, _, length in sequences]).cumsum(0)
    return Row(torch.cat(tokens), torch.cat(labels), torch.cat(mask), torch.cat(positions), cu)


class MarkovData:
    """The seeded data source of one run."""

    def __init__(
        self,
        *,
        vocab_size: int,
        row_tokens: int,
        pad_multiple: int,
        seed: int,
        drift_interval: int = 0,
        drift_fraction: float = 0.0,
        trained_steps: range = range(0),
        rows_per_step: int = 0,
    ):
        self.vocab_size = vocab_size
        # the steps and rows the draft trains on (label_counts): the plan's [warmup_steps, train_iters) x its rows
        self.trained_steps, self.rows_per_step = trained_steps, rows_per_step
        self.drift_interval, self.drift_fraction = drift_interval, drift_fraction
        self.row_tokens = row_tokens
        self.quantum = math.lcm(LENGTH_QUANTUM, pad_multiple)
        if row_tokens % self.quantum:
            raise ValueError(
                f"a packed row of {row_tokens} tokens cannot hold sequences padded to multiples of "
                f"{self.quantum}; use a seq_length that is a multiple of {self.quantum}"
            )
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        # (v, 3): the three successors of each token; distinct so the chain's top-1 is well defined.
        self.successors = torch.stack([torch.randperm(vocab_size, generator=g)[:3] for _ in range(vocab_size)])
        self.probs = torch.tensor(SUCCESSOR_PROBS)
        self._epochs = [self.successors]  # successor table of each drift epoch, built on demand

    @classmethod
    def for_plan(cls, plan) -> "MarkovData":
        """The data of ``plan``'s run: every rank, and every tool that reads the run afterwards, builds the same."""
        return cls(
            vocab_size=plan.model.vocab_size,
            row_tokens=plan.parallel.micro_batch_size * plan.model.seq_length,
            pad_multiple=plan.parallel.pad_multiple,
            seed=plan.data.seed,
            drift_interval=plan.data.drift_interval,
            drift_fraction=plan.data.drift_fraction,
            trained_steps=range(plan.training.warmup_steps, plan.training.train_iters),
            rows_per_step=plan.num_microbatches * plan.parallel.dp,
        )

    def epoch(self, step: int) -> int:
        """The drift epoch of ``step``: how many shifts happened before it (0 without drift)."""
        return step // self.drift_interval if self.drift_interval > 0 else 0

    def successors_at(self, step: int) -> torch.Tensor:
        """(v, 3) the transitions in force at ``step``. Each shift redraws the successors of a seeded
        round(fraction * v) of the tokens, on top of the previous epoch's table."""
        epoch = self.epoch(step)
        while len(self._epochs) <= epoch:
            e = len(self._epochs)
            g = torch.Generator().manual_seed(DRIFT_SEED ^ (self.seed * 1_000_003 + e))
            table = self._epochs[-1].clone()
            moved = torch.randperm(self.vocab_size, generator=g)[: round(self.drift_fraction * self.vocab_size)]
            for token in moved.tolist():
                table[token] = torch.randperm(self.vocab_size, generator=g)[:3]
            self._epochs.append(table)
        return self._epochs[epoch]

    def row(self, step: int, index: int) -> Row:
        """Row ``index`` of step ``step``'s global batch: 1-4 sequences packed to exactly row_tokens tokens."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 10_007 + index)
        units = self.row_tokens // self.quantum
        lengths: list[int] = []
        while units > 0:
            take = int(torch.randint(1, units + 1, (1,), generator=g)) if len(lengths) < 3 else units
            lengths.append(take * self.quantum)
            units -= take
        sequences = []
        successors = self.successors_at(step)
        for length in lengths:
            # A few padding tokens at the end of some sequences, as packing with per-sequence padding leaves.
            pad = int(torch.randint(0, min(4, length // 2) + 1, (1,), generator=g))
            content = length - pad
            seq = torch.empty(content, dtype=torch.long)
            seq[0] = torch.randint(0, self.vocab_size, (1,), generator=g)
            picks = torch.multinomial(self.probs, content - 1, replacement=True, generator=g)
            for i in range(1, content):
                seq[i] = successors[seq[i - 1], picks[i - 1]]
            sequences.append((seq, torch.ones(content - 1), length))
        return pack_row(sequences)

    def step_rows(self, step: int, num_rows: int) -> list[Row]:
        return [self.row(step, i) for i in range(num_rows)]

    def label_counts(self) -> torch.Tensor:
        """(V,) int64: how often each token is a loss-bearing label in the rows the draft trains on (the trained
        steps' rows): what a reduced draft vocabulary keeps the most frequent of (models/vocab/reduced.py)."""
        return count_tokens(self, self.trained_steps, self.rows_per_step)

    # The data position (packing.PackedData has the same three): every row derives from the step alone.
    def position(self, step: int) -> None:
        return None

    def restore(self, step: int, saved: dict | None) -> None:
        return None

    def summary(self) -> dict:
        return {}

    def prompt(self, step: int, index: int, length: int) -> torch.Tensor:
        """(length,) a held-out sequence drawn as the training rows of ``step`` are (a fresh uniform first token,
        then the chain in force at ``step``), from a seed namespace no training row uses: prompts to decode from."""
        g = torch.Generator().manual_seed(PROMPT_SEED ^ (self.seed * 1_000_003 + step * 10_007 + index))
        successors = self.successors_at(step)
        seq = torch.empty(length, dtype=torch.long)
        seq[0] = torch.randint(0, self.vocab_size, (1,), generator=g)
        picks = torch.multinomial(self.probs, max(length - 1, 1), replacement=True, generator=g)
        for i in range(1, length):
            seq[i] = successors[seq[i - 1], picks[i - 1]]
        return seq


def count_tokens(data: MarkovData, steps: range, rows_per_step: int) -> torch.Tensor:
    """(V,) int64: how often each target token is a loss-bearing label over ``steps`` x ``rows_per_step`` rows."""
    counts = torch.zeros(data.vocab_size, dtype=torch.int64)
    for step in steps:
        for row in data.step_rows(step, rows_per_step):
            counts += torch.bincount(row.labels[row.loss_mask.bool()], minlength=data.vocab_size)
    return counts


def shifted(x: torch.Tensor, cu_seqlens: torch.Tensor, shift: int, fill=0) -> torch.Tensor:
    """x[p + shift] within each sequence (global rows), ``fill`` past a sequence's end."""
    out = torch.full_like(x, fill)
    cu = cu_seqlens.tolist()
    for start, end in zip(cu, cu[1:]):
        if end - start > shift:
            out[start : end - shift] = x[start + shift : end]
    return out
