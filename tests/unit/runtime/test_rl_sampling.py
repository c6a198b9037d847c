"""The speculative-sampling verify rule (runtime/rl/engines/sampling.py) against the closed form: for one drafted
position the output law q(y) min(1, p(y)/q(y)) + P(reject) norm(max(0, p - q))(y) is p, in float64."""

from __future__ import annotations

import torch

from specdraft.runtime.rl.engines import sampling


def _law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    keep = q * sampling.accept_probability(p, q)  # (V,) drafted and kept
    return keep + (1 - keep.sum()) * sampling.residual(p, q)


def test_one_verified_position_is_distributed_as_the_target():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        p = torch.rand(7, generator=g, dtype=torch.float64).pow(3)
        q = torch.rand(7, generator=g, dtype=torch.float64).pow(3)
        p, q = p / p.sum(), q / q.sum()
        torch.testing.assert_close(_law(p, q), p, rtol=0, atol=1e-12)
    p = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    torch.testing.assert_close(_law(p, p.clone()), p)  # q == p: every draft kept, the residual never used


def test_accept_always_would_give_the_drafts_law():
    p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.8], dtype=torch.float64)
    assert not torch.allclose(q, p)  # so the engine test's deliberately wrong rule is visibly wrong


def test_verify_sampled_keeps_drafts_the_target_is_sure_of_and_adds_a_bonus():
    g = torch.Generator().manual_seed(0)
    p = torch.zeros(3, 3, 5)
    p[:, 0, 2] = p[:, 1, 4] = p[:, 2, 1] = 1.0  # the target is certain: 2, then 4, then 1
    q = torch.full((3, 2, 5), 0.2)
    drafts = torch.tensor([[2, 4], [3, 4], [2, 4]])
    tokens, kept = sampling.verify_sampled(p, q, drafts, torch.tensor([2, 2, 1]), g)
    assert kept.tolist() == [2, 0, 1]  # the second: p(3) = 0, rejected; the third may verify one draft only
    assert tokens[0].tolist() == [2, 4, 1] and tokens[1, 0] == 2 and tokens[2, :2].tolist() == [2, 4]


def test_verify_greedy_takes_the_longest_matching_prefix_and_the_targets_next_token():
    verdict = [3, 1, 4, 1]
    assert sampling.verify_greedy(verdict, [3, 1, 5]) == ([3, 1, 4], 2)
    assert sampling.verify_greedy(verdict, [3, 1, 4]) == ([3, 1, 4, 1], 3)
    assert sampling.verify_greedy(verdict, [0, 1, 4]) == ([3], 0)
