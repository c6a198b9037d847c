"""The draft's loss pieces: vocab-parallel KL and argmax (tp=2 against one rank), chunked + checkpointed head/KL."""

from __future__ import annotations

import pytest
import torch

from specdraft.runtime.models.vocab.parallel import argmax, head_kl_and_matches, log_softmax, vocab_parallel_kl
from tests.support.distributed import run_distributed


def _problem(seed=0, t=7, h=5, v=12):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64)
    target = torch.log_softmax(torch.randn(t, v, generator=g, dtype=torch.float64) * 3, -1)
    return hidden, weight, target


def _dense_kl(hidden, weight, target):
    logp = torch.log_softmax(hidden @ weight.T, -1)
    return (target.exp() * (target - logp)).sum(-1)


def test_kl_gradient_matches_autograd_of_the_dense_formula():
    hidden, weight, target = _problem()
    a = hidden.clone().requires_grad_()
    b = hidden.clone().requires_grad_()
    ours = vocab_parallel_kl(a @ weight.T, target)
    dense = _dense_kl(b, weight, target)
    torch.testing.assert_close(ours, dense)
    g = torch.randn_like(dense)
    torch.testing.assert_close(torch.autograd.grad(ours, a, g)[0], torch.autograd.grad(dense, b, g)[0])


def _grad_dense(hidden, weight, target, g):
    x = hidden.clone().requires_grad_()
    return torch.autograd.grad(_dense_kl(x, weight, target), x, g)[0]


def test_chunked_head_equals_one_chunk_and_dense():
    hidden, weight, target = _problem(1, t=11)
    index = torch.tensor([[i if i < 9 else -1 for i in range(11)], [i + 1 if i < 8 else -1 for i in range(11)]])
    valid = (index >= 0).double()
    head = lambda x: x @ weight.T
    results = []
    for chunk in (3, 1000):
        xs = [hidden.clone().requires_grad_() for _ in range(2)]
        kl, match = head_kl_and_matches(head, xs, target, index, valid, chunk=chunk)
        grads = torch.autograd.grad(sum(kl), xs)
        results.append((kl, match, grads))
    (kl_a, m_a, g_a), (kl_b, m_b, g_b) = results
    for a, b in zip(kl_a + list(g_a), kl_b + list(g_b)):
        torch.testing.assert_close(a, b)
    assert all(torch.equal(a, b) for a, b in zip(m_a, m_b))
    want = (_dense_kl(hidden, weight, target[index[0].clamp(min=0)]) * valid[0]).sum()
    torch.testing.assert_close(kl_a[0], want)
    top = (hidden @ weight.T).argmax(-1) == target[index[1].clamp(min=0)].argmax(-1)
    assert torch.equal(m_a[1], top & valid[1].bool())


def _tp2_worker(rank, world, seed):
    import torch.distributed as dist

    hidden, weight, target = _problem(seed)
    v = weight.shape[0] // 2
    group = dist.group.WORLD
    shard_w, shard_t = weight[rank * v : (rank + 1) * v], target[:, rank * v : (rank + 1) * v]
    x = hidden.clone().requires_grad_()
    kl = vocab_parallel_kl(x @ shard_w.T, shard_t, group)
    g = torch.ones_like(kl)
    (dx,) = torch.autograd.grad(kl, x, g)
    dist.all_reduce(dx)  # a column-parallel head's backward sums the input gradient over tp
    lp = log_softmax(hidden @ shard_w.T, group)
    return kl.detach(), dx, lp, argmax(hidden @ shard_w.T, group)


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_tp2_kl_logsoftmax_and_argmax_match_one_rank():
    results = run_distributed(_tp2_worker, 2, 3, timeout=90)
    hidden, weight, target = _problem(3)
    want_kl = _dense_kl(hidden, weight, target)
    want_dx = _grad_dense(hidden, weight, target, torch.ones_like(want_kl))
    want_lp = torch.log_softmax(hidden @ weight.T, -1)
    for rank, (kl, dx, lp, top) in enumerate(results):
        torch.testing.assert_close(kl, want_kl)
        torch.testing.assert_close(dx, want_dx)
        torch.testing.assert_close(lp, want_lp[:, rank * 6 : (rank + 1) * 6])
        assert torch.equal(top, (hidden @ weight.T).argmax(-1))
