"""GRPO advantages and NeMo-RL's clipped policy-gradient loss against plain float64 references written here."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specdraft.runtime.rl.advantages import group_advantages
from specdraft.runtime.rl.loss import ClipSettings, clipped_pg_sums


def reference_advantages(rewards, g, normalize, leave_one_out):
    out = []
    for i in range(0, len(rewards), g):
        group = rewards[i : i + g]
        mean = sum(group) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (g - 1))
        for x in group:
            base = (sum(group) - x) / (g - 1) if leave_one_out else mean
            a = x - base
            out.append((0.0 if std == 0 else a / (std + 1e-6)) if normalize else a)
    return out


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("leave_one_out", [True, False])
def test_advantages_equal_the_float64_reference(normalize, leave_one_out):
    rng = random.Random(3)
    rewards = [rng.random() for _ in range(12)] + [0.5] * 4  # the last group is flat: advantage 0
    values = torch.tensor(rewards, dtype=torch.float64)
    got = group_advantages(values, 4, normalize=normalize, leave_one_out=leave_one_out)
    want = reference_advantages(rewards, 4, normalize, leave_one_out)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
    if normalize:
        assert got[-4:].tolist() == [0.0] * 4


def reference_loss(logp, old, adv, mask, ref, lo, hi, beta):
    total = pg_sum = kl_sum = clipped = 0.0
    for lp, o, a, m, r in zip(logp, old, adv, mask, ref):
        ratio = math.exp(lp - o)
        l1, l2 = -a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi)
        pg = max(l1, l2)
        kl = math.exp(r - lp) - (r - lp) - 1
        total += m * (pg + beta * kl)
        pg_sum += m * pg
        kl_sum += m * kl
        clipped += m * (l2 > l1)
    return total, pg_sum, kl_sum, clipped


def test_clipped_loss_and_its_gradient_equal_the_float64_reference():
    g = torch.Generator().manual_seed(0)
    n = 64
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(n, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    ref = old + torch.randn(n, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, generator=g) > 0.3).double()
    settings = ClipSettings(ratio_clip_min=0.2, ratio_clip_max=0.28, kl_penalty=0.05)
    total, sums = clipped_pg_sums(logp, old, adv, mask, ref, settings)
    want = reference_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), ref.tolist(), 0.2, 0.28, 0.05)
    assert [float(total.detach()), float(sums["pg"]), float(sums["kl"]), float(sums["clipped"])] == pytest.approx(
        list(want), rel=1e-12
    )
    assert 0 < float(sums["clipped"]) < mask.sum()  # the clip takes effect on some tokens, not all
    total.backward()
    eps = 1e-6
    for i in range(0, n, 7):  # central differences of the float64 reference
        up, down = logp.detach().tolist(), logp.detach().tolist()
        up[i] += eps
        down[i] -= eps
        args = (old.tolist(), adv.tolist(), mask.tolist(), ref.tolist(), 0.2, 0.28, 0.05)
        numeric = (reference_loss(up, *args)[0] - reference_loss(down, *args)[0]) / (2 * eps)
        assert float(logp.grad[i]) == pytest.approx(numeric, rel=1e-5, abs=1e-8)


def test_no_reference_means_no_kl_and_ratio_one_is_plain_policy_gradient():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    total, sums = clipped_pg_sums(logp, logp.clone(), adv, torch.ones(3), None, ClipSettings(0.2, 0.2, 0.0))
    assert float(total) == pytest.approx(-float(adv.sum()))
    assert float(sums["kl"]) == 0.0 and float(sums["clipped"]) == 0.0


def test_packed_rows_put_the_loss_and_the_advantage_on_the_response_labels():
    from specdraft.runtime.rl.batch import Sample, pack

    samples = [Sample((1, 5, 6, 2), (7, 8, 3), 0.5), Sample((1, 9, 2), (4,), -1.0), Sample((1, 2), (5, 6), 2.0)]
    rows, adv = pack(samples, row_tokens=32, length=16, num_rows=3)
    first = rows[0]
    assert first.cu_seqlens.tolist() == [0, 16, 32]
    # sequence 0: labels 3..5 predict the response (7, 8, 3); sequence 1 (at 16): label 18 predicts 4
    assert first.loss_mask.nonzero().flatten().tolist() == [3, 4, 5, 18]
    assert first.labels[[3, 4, 5, 18]].tolist() == [7, 8, 3, 4]
    assert adv[0][[3, 4, 5, 18]].tolist() == [0.5, 0.5, 0.5, -1.0] and adv[0].abs().sum() == 2.5
    assert rows[1].loss_mask.sum() == 2 and rows[2].loss_mask.sum() == 0  # the last row is all padding
