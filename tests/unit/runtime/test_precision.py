"""Mixed precision (runtime/train/precision.py) on CPU, against references:

- fp32 main weights: a bf16 model trained through MainOptimizer stays close to the same model trained in fp32,
  while plain AdamW on the bf16 parameters loses updates below bf16 resolution and drifts away from it.
- Gradients of several microbatches accumulate in fp32: the buffer equals the fp32 sum of each microbatch's bf16
  gradient exactly (bf16 accumulation, what autograd alone does, rounds).
- The dynamic loss scaler follows Megatron's DynamicGradScaler rules (hysteresis, backoff, growth window, floor).
- The distributed optimizer (2 gloo ranks, whole-parameter owners) steps to bit-identical parameters as the
  replicated one, in fp32 and bf16, holding about half the optimizer state per rank; owners are balanced.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.runtime.train.precision import LossScaler, MainOptimizer, Policy, owners
from tests.support.distributed import run_distributed

CPU = torch.device("cpu")


def _policy(dtype: str, reduce_in_bf16: bool = False) -> Policy:
    class Training:  # the two fields Policy.of reads
        pass

    t = Training()
    t.dtype, t.grad_reduce_in_bf16 = dtype, reduce_in_bf16
    return Policy.of(t)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def _data(step: int, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(2, 32, 16, generator=g)  # two microbatches of 32 rows
    y = torch.randn(2, 32, 8, generator=g)
    return x.to(dtype), y.to(dtype)


def _train(model, step_fn, dtype, steps: int) -> None:
    for step in range(steps):
        x, y = _data(step, dtype)
        for mb in range(2):
            ((model(x[mb]) - y[mb]).float().pow(2).mean() / 2).backward()
        step_fn()


def test_main_weights_track_the_fp32_run_and_plain_bf16_adamw_does_not():
    lr, steps = 1e-4, 40
    start = [p.detach().clone() for p in _model().parameters()]

    ref = _model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr)
    _train(ref, lambda: (ref_opt.step(), ref_opt.zero_grad()), torch.float32, steps)

    mixed = _model().to(torch.bfloat16)
    opt = MainOptimizer(list(mixed.parameters()), lr=lr, policy=_policy("bf16"), device=CPU)
    _train(mixed, opt.step, torch.bfloat16, steps)

    plain = _model().to(torch.bfloat16)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=lr)
    _train(plain, lambda: (plain_opt.step(), plain_opt.zero_grad()), torch.bfloat16, steps)

    def distance(weights) -> float:  # from the fp32 run, relative to how far the fp32 run moved
        moved = sum((r.detach() - s).pow(2).sum() for r, s in zip(ref.parameters(), start)).sqrt()
        return float(
            sum((w.detach().float() - r.detach()).pow(2).sum() for w, r in zip(weights, ref.parameters())).sqrt()
            / moved
        )

    with_main = distance(opt.main)
    without = distance(list(plain.parameters()))
    assert with_main < 0.2, with_main
    assert without > 0.6, without  # most of its updates were below half a bf16 ulp and vanished
    assert with_main < without / 4, (with_main, without)
    # The bf16 parameters are the main weights rounded.
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(mixed.parameters(), opt.main))


def test_microbatch_grads_accumulate_in_fp32():
    model = _model().to(torch.bfloat16)
    opt = MainOptimizer(list(model.parameters()), lr=1e-3, policy=_policy("bf16"), device=CPU)
    x, y = _data(0, torch.bfloat16)
    per_mb = []
    for mb in range(2):
        loss = (model(x[mb]) - y[mb]).float().pow(2).mean()
        per_mb.append(torch.autograd.grad(loss, list(model.parameters())))
    for mb in range(2):
        (model(x[mb]) - y[mb]).float().pow(2).mean().backward()
    rounded = 0
    for i, view in enumerate(opt.views):
        exact = per_mb[0][i].float() + per_mb[1][i].float()
        assert view.grad.dtype == torch.float32 and torch.equal(view.grad, exact)
        assert view.param.grad is None  # the bf16 grad was freed into the buffer
        rounded += int(not torch.equal((per_mb[0][i] + per_mb[1][i]).float(), exact))
    assert rounded > 0, "bf16 accumulation would have rounded somewhere"

    # grad_reduce_in_bf16: autograd's own bf16 accumulation, reduced as is.
    model = _model().to(torch.bfloat16)
    opt = MainOptimizer(list(model.parameters()), lr=1e-3, policy=_policy("bf16", reduce_in_bf16=True), device=CPU)
    (model(x[0]) - y[0]).float().pow(2).mean().backward()
    assert all(v.grad is v.param.grad and v.grad.dtype == torch.bfloat16 for v in opt.views)
    # fp32 parameters are their own main weights: no copies, no buffers.
    model = _model()
    opt = MainOptimizer(list(model.parameters()), lr=1e-3, policy=_policy("fp32"), device=CPU)
    assert all(m is p for m, p in zip(opt.main, model.parameters())) and opt.state_bytes() == 0


def test_loss_scaler_follows_megatrons_rules():
    s = LossScaler(initial=2.0**4, min_scale=2.0, window=3, hysteresis=2)
    trace = []
    for found_inf in [True, True, True, False, False, False, False, True, True, True, True, True]:
        s.update(found_inf)
        trace.append((s.scale, s.growth_tracker, s.hysteresis_tracker))
    assert [t[0] for t in trace] == [16, 8, 4, 4, 4, 8, 8, 8, 4, 2, 2, 2]
    # The hysteresis count is restored only when the scale grows (Megatron's DynamicGradScaler).
    assert trace[2][2] == -1 and trace[5][2] == 2 and trace[7][2] == 1
    restored = LossScaler()
    restored.load(s.state())
    assert restored.state() == s.state()
    assert float(s.scale_loss(torch.tensor(3.0))) == 6.0
    with pytest.raises(ValueError):
        LossScaler(initial=1.0, min_scale=2.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=40), st.integers(1, 8))
def test_owners_cover_every_parameter_and_balance_within_one_parameter(sizes, group):
    params = [torch.empty(n) for n in sizes]
    who = owners(params, group)
    assert len(who) == len(params) and all(0 <= r < group for r in who)
    load = [sum(n for n, r in zip(sizes, who) if r == k) for k in range(group)]
    assert max(load) - min(load) <= max(sizes)
    assert who == owners(params, group), "deterministic: every member computes the same map"


def _sharded_worker(rank, world):
    import torch.distributed as dist

    out = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        models = [_model(seed=3).to(dtype), _model(seed=3).to(dtype)]
        replicated = MainOptimizer(list(models[0].parameters()), lr=1e-2, policy=_policy(name), device=CPU)
        group = dist.group.WORLD
        sharded = MainOptimizer(
            list(models[1].parameters()),
            lr=1e-2,
            policy=_policy(name),
            device=CPU,
            shards=[(list(models[1].parameters()), group)],
        )
        for step in range(5):
            x, y = _data(step, dtype)  # the same data on both ranks: the grads are already "reduced"
            for model, opt in zip(models, (replicated, sharded)):
                (model(x[0]) - y[0]).float().pow(2).mean().backward()
                opt.step()
        out[name] = {
            "identical": all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters())),
            "replicated_bytes": replicated.state_bytes(),
            "sharded_bytes": sharded.state_bytes(),
            "owned": len(sharded.owned),
            "params": len(sharded.params),
            "sharded_over": sharded.sharded_over,
        }
    return out


@pytest.mark.dist
def test_distributed_optimizer_matches_the_replicated_one_bit_for_bit():
    results = run_distributed(_sharded_worker, 2, timeout=120)
    for name in ("fp32", "bf16"):
        per_rank = [r[name] for r in results]
        assert all(r["identical"] for r in per_rank), name
        assert sum(r["owned"] for r in per_rank) == per_rank[0]["params"]
        total = sum(r["sharded_bytes"] for r in per_rank)
        assert abs(total - per_rank[0]["replicated_bytes"]) <= 8 * per_rank[0]["params"], name  # step counters
        assert all(r["sharded_bytes"] < 0.75 * r["replicated_bytes"] for r in per_rank), name
        assert per_rank[0]["sharded_over"] == 2


def test_a_warm_up_raises_the_rate_linearly_by_adams_own_step_count():
    """draft.lr_warmup_steps: the n-th step runs at lr * n / warmup, then at lr. Adam's early steps move each weight
    by about the rate whatever the gradient's scale, so with a constant gradient the moves are the rates (less
    AdamW's small weight decay); the count is AdamW's own step, which a checkpoint restores, so a resumed run
    continues the ramp."""

    def moves(warmup: int, steps: int, state: dict | None = None) -> tuple[list[float], dict]:
        p = torch.nn.Parameter(torch.zeros(4))
        opt = MainOptimizer([p], lr=0.1, policy=_policy("fp32"), device=CPU, warmup_steps=warmup)
        if state is not None:
            opt.optimizer.load_state_dict(state)
        out = []
        for _ in range(steps):
            before = p.detach().clone()
            p.grad = torch.ones(4)
            opt.step()
            out.append(float((before - p.detach()).mean()))
        return out, opt.optimizer.state_dict()

    assert moves(4, 6)[0] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1], rel=5e-3)
    assert moves(0, 2)[0] == pytest.approx([0.1, 0.1], rel=5e-3), "no warm-up: the full rate from the first step"
    _, saved = moves(4, 2)
    assert moves(4, 3, saved)[0] == pytest.approx([0.075, 0.1, 0.1], rel=5e-3), "a restored step count resumes it"
