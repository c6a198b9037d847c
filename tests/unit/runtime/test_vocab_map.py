"""The reduced draft vocabulary and the drifting data.

- mapping(): the Vd most frequent tokens as SpecForge picks them (a naive Counter-based reference, hypothesis over
  counts with ties and unseen tokens), sorted, with d2t offsets and t2d marks; count_tokens() counts loss-bearing
  labels of the seeded rows.
- Restriction: the policy's logits restricted to the draft vocabulary and renormalised, at tp = 2 against a dense
  float64 reference (shards keeping different numbers of columns, more rows than one gather chunk), and the mask
  of rows whose top-1 the draft vocabulary lacks.
- MarkovData: without drift the rows are exactly those of the data source before drift existed (a golden digest);
  with drift the transitions move every M steps, a seeded share of tokens at a time, the same in every instance.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.runtime.models.vocab.reduced import mapping
from specdraft.runtime.train.data import MarkovData, count_tokens
from tests.support.distributed import run_distributed

# sha256 of rows (steps 0, 1, 17, 250; rows 0-2) of MarkovData(128, 64, 4, seed 1234) as it was before drift.
ROWS_DIGEST = "44fa616e07e227da4c5af75929c58af9feafe48358b493b7239869c12bc76171"


def _naive(counts: list[int], draft_vocab: int) -> list[int]:
    """SpecForge's recipe, written plainly: pad with the lowest unseen ids, take the most common (ties: lower id)."""
    seen = {t: c for t, c in enumerate(counts) if c > 0}
    for token in range(len(counts)):
        if len(seen) >= draft_vocab:
            break
        seen.setdefault(token, 0)
    return sorted(sorted(seen, key=lambda t: (-seen[t], t))[:draft_vocab])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=40).flatmap(
        lambda c: st.tuples(st.just(c), st.integers(1, len(c)))
    )
)
def test_mapping_keeps_the_most_frequent_tokens_as_specforge_does(case):
    counts, draft_vocab = case
    d2t, t2d = mapping(torch.tensor(counts), draft_vocab)
    kept = (torch.arange(draft_vocab) + d2t).tolist()
    assert kept == _naive(counts, draft_vocab)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (len(counts),)
    assert sorted(t2d.nonzero().squeeze(1).tolist()) == kept


def test_count_tokens_counts_the_loss_bearing_labels():
    data = MarkovData(vocab_size=64, row_tokens=64, pad_multiple=2, seed=5)
    counts = count_tokens(data, range(2, 4), 3)
    manual = torch.zeros(64, dtype=torch.int64)
    for step in (2, 3):
        for i in range(3):
            row = data.row(step, i)
            for label, m in zip(row.labels.tolist(), row.loss_mask.tolist()):
                manual[label] += int(m)
    assert torch.equal(counts, manual) and int(counts.sum()) > 0
    with pytest.raises(ValueError, match="draft vocabulary"):
        mapping(counts, 65)


def _restriction(rank, world, cases):
    import torch.distributed as dist

    from specdraft.runtime.models.vocab.reduced import Restriction

    group = dist.new_group([0, 1])
    out = []
    for logits, t2d in cases:
        per = logits.shape[1] // world
        local = logits[:, rank * per : (rank + 1) * per].float()
        r = Restriction(t2d, group)
        out.append((r.log_probs(local), r.top1_kept(local)))
    return out


def test_restriction_renormalises_over_the_draft_vocabulary_at_tp2():
    g = torch.Generator().manual_seed(11)
    cases = []
    for rows, vocab, keep in (
        (5, 16, [0, 1, 2, 3, 4, 9]),
        (2100, 32, list(range(0, 32, 3))[:10]),
        (7, 12, [11, 10, 1, 0]),
    ):
        logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 3
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[keep] = True
        cases.append((logits, t2d))
    results = run_distributed(_restriction, 2, cases, timeout=120)
    for (logits, t2d), *per_rank in zip(cases, *results):
        kept = t2d.nonzero().squeeze(1)
        want = torch.log_softmax(logits[:, kept], dim=-1)  # dense float64 reference
        got = torch.cat([lp for lp, _ in per_rank], dim=1).double()
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
        inside = t2d[logits.argmax(-1)].float()
        for _, top in per_rank:
            assert torch.equal(top, inside)


def _digest(data: MarkovData) -> str:
    h = hashlib.sha256()
    for step in (0, 1, 17, 250):
        for i in range(3):
            r = data.row(step, i)
            for t in (r.tokens, r.labels, r.loss_mask, r.positions, r.cu_seqlens):
                h.update(t.numpy().tobytes())
    return h.hexdigest()


def test_data_without_drift_is_unchanged_and_drift_moves_the_transitions():
    assert _digest(MarkovData(vocab_size=128, row_tokens=64, pad_multiple=4, seed=1234)) == ROWS_DIGEST
    assert (
        _digest(
            MarkovData(vocab_size=128, row_tokens=64, pad_multiple=4, seed=1234, drift_interval=0, drift_fraction=0.5)
        )
        == ROWS_DIGEST
    )
    a = MarkovData(vocab_size=128, row_tokens=64, pad_multiple=4, seed=1234, drift_interval=10, drift_fraction=0.25)
    b = MarkovData(vocab_size=128, row_tokens=64, pad_multiple=4, seed=1234, drift_interval=10, drift_fraction=0.25)
    base = MarkovData(vocab_size=128, row_tokens=64, pad_multiple=4, seed=1234)
    assert torch.equal(a.successors_at(9), base.successors) and a.epoch(9) == 0 and a.epoch(10) == 1
    assert torch.equal(a.row(9, 1).tokens, base.row(9, 1).tokens)
    moved = (a.successors_at(10) != a.successors_at(9)).any(1)
    assert 0 < int(moved.sum()) <= 32  # at most round(0.25 * 128) tokens get new successors per shift
    assert torch.equal(a.successors_at(25), b.successors_at(25))  # seeded: the same in every rank's instance
    assert torch.equal(a.successors_at(10), a.successors_at(19)) and not torch.equal(
        a.successors_at(20), a.successors_at(19)
    )
    for table in (a.successors_at(30),):  # three distinct successors per token, as the base chain has
        assert all(len(set(row)) == 3 for row in table.tolist())
    prompt = a.prompt(25, 0, 12)
    table = a.successors_at(25)
    assert all(int(y) in table[int(x)].tolist() for x, y in zip(prompt[:-1], prompt[1:]))
    assert torch.equal(prompt, b.prompt(25, 0, 12)) and not torch.equal(prompt, a.prompt(25, 1, 12))
