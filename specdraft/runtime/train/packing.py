"""A tokenised data file packed into the runtime's THD rows, in a seeded order, and the data position a checkpoint
saves (docs/data.md, "Packing").

Each epoch visits every sample once, in a permutation drawn from (seed, epoch) (file order with data.shuffle off).
Rows fill greedily in that order: each sample, padded to a multiple of plan.data.length_multiple, joins the current
row while it fits, else the row is closed (its last sequence takes the leftover as padding) and the next row starts
with it; epochs run on without a break. Step s takes the next plan.num_microbatches x dp rows. The position (epoch,
index of the next sample in that epoch's order) before each step is a pure function of the step, the same on every
rank; a checkpoint records it, and a resume continues from the recorded position.
"""

from __future__ import annotations

import hashlib

import torch

from specdraft.runtime.train.corpus import Corpus
from specdraft.runtime.train.data import MarkovData, Row, pack_row

ORDER_SEED = 0xDA7A5EED  # the sample order's seed namespace, apart from the Markov chain's and the weights'


class PackedData:
    """The samples of one run's data file as packed rows; the same interface as data.MarkovData."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        vocab_size: int,
        row_tokens: int,
        rows_per_step: int,
        length_multiple: int,
        seed: int,
        shuffle: bool,
    ):
        self.corpus, self.vocab_size = corpus, vocab_size
        self.row_tokens, self.rows_per_step, self.quantum = row_tokens, rows_per_step, length_multiple
        if row_tokens % length_multiple:
            raise ValueError(f"a packed row of {row_tokens} tokens is not a multiple of {length_multiple}")
        self.seed, self.shuffle = seed, shuffle
        self.lengths = [-(-len(s.tokens) // self.quantum) * self.quantum for s in corpus.samples]  # padded
        if max(self.lengths) > row_tokens:
            raise ValueError(f"a sample of {max(self.lengths)} padded tokens does not fit a row of {row_tokens}")
        self._starts: dict[int, tuple[int, int]] = {0: (0, 0)}  # step -> position before it
        self._order: tuple[int, list[int]] | None = None  # (epoch, its permutation), the last one drawn
        self._rows_digest = hashlib.sha256()

    @classmethod
    def for_plan(cls, plan, corpus: Corpus) -> "PackedData":
        return cls(
            corpus,
            vocab_size=plan.model.vocab_size,
            row_tokens=plan.parallel.micro_batch_size * plan.model.seq_length,
            rows_per_step=plan.num_microbatches * plan.parallel.dp,
            length_multiple=plan.data.length_multiple,
            seed=plan.data.seed,
            shuffle=plan.data.shuffle,
        )

    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s sample order: a permutation seeded by (seed, epoch), or file order without shuffle."""
        if self._order is None or self._order[0] != epoch:
            n = len(self.corpus.samples)
            if self.shuffle:
                g = torch.Generator().manual_seed(ORDER_SEED ^ (self.seed * 1_000_003 + epoch))
                perm = torch.randperm(n, generator=g).tolist()
            else:
                perm = list(range(n))
            self._order = (epoch, perm)
        return self._order[1]

    def _layout(self, position: tuple[int, int], num_rows: int) -> tuple[list[list[int]], tuple[int, int]]:
        """The sample ids of ``num_rows`` rows packed from ``position``, and the position after them."""
        epoch, index = position
        n = len(self.corpus.samples)
        rows = []
        for _ in range(num_rows):
            members, used = [], 0
            while True:
                if index == n:
                    epoch, index = epoch + 1, 0
                sample = self.order(epoch)[index]
                if used + self.lengths[sample] > self.row_tokens:
                    break  # never on a row's first sample: every sample fits a row
                members.append(sample)
                used += self.lengths[sample]
                index += 1
            rows.append(members)
        return rows, (epoch, index)

    def position_at(self, step: int) -> tuple[int, int]:
        """The position before ``step``: the recorded one, or the nearest earlier one advanced step by step."""
        known = max(s for s in self._starts if s <= step)
        position = self._starts[known]
        for s in range(known, step):
            position = self._layout(position, self.rows_per_step)[1]
            self._starts[s + 1] = position
        return position

    def step_rows(self, step: int, num_rows: int) -> list[Row]:
        """The ``num_rows`` rows of step ``step``'s global batch (every rank builds all of them, then takes its own)."""
        if num_rows != self.rows_per_step:
            raise ValueError(f"a step of this data has {self.rows_per_step} rows, not {num_rows}")
        members, after = self._layout(self.position_at(step), num_rows)
        self._starts[step + 1] = after
        rows = [self._row(ids) for ids in members]
        for row in rows:
            for x in (row.tokens, row.labels, row.loss_mask, row.cu_seqlens):
                self._rows_digest.update(x.numpy().tobytes())
        return rows

    def _row(self, ids: list[int]) -> Row:
        lengths = [self.lengths[i] for i in ids]
        lengths[-1] += self.row_tokens - sum(lengths)  # the leftover pads the row's last sequence
        # row p predicts token p+1: loss where that one is trained
        samples = [self.corpus.samples[i] for i in ids]
        return pack_row([(s.tokens, s.trained[1:].float(), length) for s, length in zip(samples, lengths)])

    def label_counts(self) -> torch.Tensor:
        """(V,) int64: how often each token is a loss-bearing label over the file (each sample once)."""
        counts = torch.zeros(self.vocab_size, dtype=torch.int64)
        for s in self.corpus.samples:
            counts += torch.bincount(s.tokens[1:][s.trained[1:]], minlength=self.vocab_size)
        return counts

    # ---------------------------------------------------------------------------------------- data position
    def position(self, step: int) -> dict:
        """What a checkpoint after ``step`` steps (and each metrics row) records: the next sample to read."""
        epoch, index = self.position_at(step)
        out = {"epoch": epoch, "index": index, "digest": self.corpus.digest}
        return {**out, "sha256": self.corpus.sha256} if self.corpus.sha256 else out

    def restore(self, step: int, saved: dict | None) -> str | None:
        """Continue at the position a checkpoint recorded before ``step``; returns a warning when the checkpoint
        was written with other data (then this data starts from its beginning: checkpoint.restore refuses that
        unless the launch allowed a data change) or records no position."""
        if not saved or "epoch" not in saved:
            start, why = (0, 0), "it was written with the built-in Markov data"
        elif saved.get("digest") != self.corpus.digest:
            start, why = (0, 0), f"it was written with other data (digest {str(saved.get('digest'))[:12]})"
        elif not 0 <= int(saved["index"]) <= len(self.corpus.samples):  # the marker's types are checked (runs/)
            start, why = (0, 0), f"its sample index {saved['index']} is past this data's {len(self.corpus.samples)}"
        else:
            start, why = (int(saved["epoch"]), int(saved["index"])), None
        self._starts = {s: p for s, p in self._starts.items() if s < step}
        self._starts[step] = start
        if why is None:
            return None
        return f"the checkpoint's data position does not apply: {why}; the data starts at its first sample"

    def summary(self) -> dict:
        """For the rank's result: a digest of every row this rank built (equal on every rank)."""
        return {"data": {"rows_sha256": self._rows_digest.hexdigest(), "samples": len(self.corpus.samples)}}


def data_for(ctx):
    """The run's data source: the plan's data file (ctx.data, tokenised by runtime.entry before any collective)
    packed into rows, or the built-in Markov chain."""
    plan = ctx.plan
    if plan.data.path is None:
        return MarkovData.for_plan(plan)
    if ctx.data is not None:
        return PackedData.for_plan(plan, ctx.data)
    from specdraft.runtime.train.corpus import load_corpus

    return PackedData.for_plan(plan, load_corpus(plan))
