"""branch_attention and zigzag sharding against a dense float64 reference with an explicit EAGLE-3 TTT mask,
at cp 1 (in-process), 2 and 4 (one spawned gloo world each, many cases inside), plus input validation. Every case
runs both the plain-torch reference path and the fused CPU-flash path, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from specdraft.runtime.attention import branch as ba
from specdraft.runtime.attention import reference as ref_kernels
from tests.support.distributed import run_distributed

BACKENDS = ("reference", "fused-cpu-flash")


def dense_attention(q, k, v, cu, scale=None):
    """Dense TTT attention on the whole unsharded batch with a materialised (S*N, S*N) mask; tests only."""
    S, N, H, D = q.shape
    g = H // k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.tensor(cu).diff())
    row = torch.arange(N)
    trunk = (seq[:, None] == seq[None, :]) & (row[None, :] <= row[:, None])  # (N, N) causal within a sequence
    allowed = torch.zeros(S, N, S, N, dtype=torch.bool)
    for j in range(S):
        allowed[j, :, 0] = trunk
        for i in range(1, j + 1):
            allowed[j, :, i] = torch.eye(N, dtype=torch.bool)  # branch key of step i at the same row only
    qf = q.permute(2, 0, 1, 3).reshape(H, S * N, D)
    kf, vf = (x.repeat_interleave(g, 2).permute(2, 0, 1, 3).reshape(H, S * N, D) for x in (k, v))
    s = (qf @ kf.transpose(1, 2) * scale).masked_fill(~allowed.reshape(S * N, S * N), float("-inf"))
    return (torch.softmax(s, -1) @ vf).reshape(H, S, N, D).permute(1, 2, 0, 3)


def _case_tensors(case):
    gen = torch.Generator().manual_seed(case["seed"])
    S, H, hkv, D, n = case["S"], case["H"], case["Hkv"], case["D"], sum(case["lengths"])
    q, k, v = (torch.randn(S, n, h, D, generator=gen, dtype=torch.float64) for h in (H, hkv, hkv))
    return q, k, v, torch.randn(S, n, H, D, generator=gen, dtype=torch.float64)


def _out_and_grads(fn, q, k, v, dout):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def _sq(a, ref):
    """(squared error norm, squared reference norm): summed over cases and ranks before taking ratios."""
    return (a.double() - ref).square().sum().item(), ref.square().sum().item()


def _check_cases(rank, world, cases, group_ranks=None):
    """Per case: squared errors of this rank's out/dq/dk/dv shards against the float64 reference (see _sq) for each
    backend in float64 and float32, and for a plain dense float32 implementation (the yardstick for float32)."""
    group = None
    if world > 1:
        group = dist.group.WORLD
        for ranks in group_ranks or []:  # every rank creates every subgroup; keep the one holding this rank
            sub = dist.new_group(ranks)
            group = sub if rank in ranks else group
    cp = 1 if group is None else dist.get_world_size(group)
    cp_rank = 0 if group is None else dist.get_rank(group)
    report, default_tile = [], ref_kernels.TILE_ELEMENTS
    try:
        for case in cases:
            ref_kernels.TILE_ELEMENTS = case["tile"] or default_tile
            report.append(_check_case(case, group, cp, cp_rank))
    finally:  # the cp=1 test runs in the pytest process itself
        ref_kernels.TILE_ELEMENTS = default_tile
    return report


def _check_case(case, group, cp, cp_rank):
    cu = [0]
    for n in case["lengths"]:
        cu.append(cu[-1] + n)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    full = _case_tensors(case)

    def dense(q, k, v):
        return dense_attention(q, k, v, cu, case["scale"])

    def ring(q, k, v, backend):
        return ba.branch_attention(q, k, v, cu_t, cp_group=group, softmax_scale=case["scale"], backend=backend)

    def mine(x):
        return ba.zigzag_shard(x, cu_t, cp, cp_rank, dim=1)

    ref = _out_and_grads(dense, *full)
    dense32 = _out_and_grads(dense, *(x.float() for x in full))
    shard = [mine(x) for x in full]
    errs = {"dense32": [_sq(mine(d), mine(r)) for d, r in zip(dense32, ref)]}
    # The sequential TTT form: q holds only the newest step, k/v all of them (one ring pass per step).
    q, k, v, dout = full
    last_dout = torch.zeros_like(dout)
    last_dout[-1] = dout[-1]
    ref_last = _out_and_grads(dense, q, k, v, last_dout)
    want_last = [mine(ref_last[0])[-1:], mine(ref_last[1])[-1:], mine(ref_last[2]), mine(ref_last[3])]
    for backend in BACKENDS:
        for suffix, dtype in (("64", torch.float64), ("32", torch.float32)):
            got = _out_and_grads(lambda q, k, v: ring(q, k, v, backend), *(x.to(dtype) for x in shard))  # noqa: B023
            assert all(g.dtype == dtype for g in got)
            errs[backend + suffix] = [_sq(g, mine(r)) for g, r in zip(got, ref)]
        got = _out_and_grads(
            lambda q, k, v: ring(q, k, v, backend),  # noqa: B023
            mine(q)[-1:],
            mine(k),
            mine(v),
            mine(last_dout)[-1:],
        )
        errs[backend + "-last64"] = [_sq(g, w) for g, w in zip(got, want_last)]
    return errs


def _bad_lengths_raise():
    """Inputs that are only wrong at cp > 1 raise ValueError on every rank before any communication."""
    q = torch.zeros(1, 3, 2, 4)
    for cu, match in (([0, 6], "multiple of 2\\*cp_size=4"), ([0, 4, 8], "must equal T\\*cp")):
        with pytest.raises(ValueError, match=match):
            ba.branch_attention(q, q, q, torch.tensor(cu), cp_group=dist.group.WORLD)
    return True


def _cp2_worker(rank, world, cases):
    return _check_cases(rank, world, cases), _bad_lengths_raise()


FIXED = [  # (S, H, Hkv, D, sequence lengths in units of 2*cp, tile)
    (1, 2, 2, 8, [1], None),
    (1, 4, 2, 8, [3, 1, 2], None),
    (2, 4, 2, 8, [2, 1], None),
    (4, 4, 2, 4, [1, 3, 2, 2], None),
    (4, 2, 1, 8, [4], 24),
    (2, 4, 4, 4, [3, 1, 4, 2], 40),
    (4, 4, 2, 8, [2, 1, 3], 64),
    (1, 4, 1, 4, [4, 1], 16),
]

CASE = st.fixed_dictionaries(
    {
        "S": st.sampled_from([1, 2, 3, 4]),
        "heads": st.sampled_from([(2, 2), (4, 2), (4, 1), (6, 3)]),
        "D": st.sampled_from([4, 8]),
        "units": st.lists(st.integers(1, 4), min_size=1, max_size=4),
        "tile": st.sampled_from([None, 16, 48, 200]),
        "seed": st.integers(0, 2**31 - 1),
        "scale": st.sampled_from([None, 0.25, 1.0]),
    }
)


def _draw(strategy, n):
    """n examples from a hypothesis strategy, deterministic across runs, drawn in the parent and shipped to the
    spawned ranks (shrinking across processes would need every rank to agree on each failure)."""
    drawn = []
    if n < 1:
        return drawn

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate], deadline=None)
    @given(strategy)
    def collect(x):
        drawn.append(x)

    collect()
    return drawn[:n]


def _cases(cp, n_drawn):
    cases = [
        dict(
            S=S,
            H=H,
            Hkv=hkv,
            D=D,
            lengths=[u * 2 * cp for u in units],
            tile=tile,
            seed=i,
            scale=0.3 if i % 3 == 1 else None,
        )
        for i, (S, H, hkv, D, units, tile) in enumerate(FIXED)
    ]
    for d in _draw(CASE, n_drawn):
        cases.append(
            dict(
                S=d["S"],
                H=d["heads"][0],
                Hkv=d["heads"][1],
                D=d["D"],
                tile=d["tile"],
                seed=d["seed"],
                lengths=[u * 2 * cp for u in d["units"]],
                scale=d["scale"],
            )
        )
    return cases


def _assert_report(cases, reports):
    """Float64: every backend, case, rank and tensor within 1e-6 relative. Float32: each backend's relative error,
    pooled over all cases and ranks per tensor, at most 2x that of dense float32 (per-case ratios of ~1e-7 errors on
    a few hundred elements are rounding noise; pooled, the ratio measures the merge's real precision cost)."""
    pooled = {name: [[0.0, 0.0] for _ in range(4)] for name in (*(b + "32" for b in BACKENDS), "dense32")}
    for rank, report in enumerate(reports):
        for case, errs in zip(cases, report):
            for i, what in enumerate(("out", "dq", "dk", "dv")):
                for name in (n for b in BACKENDS for n in (b + "64", b + "-last64")):
                    err, norm = errs[name][i]
                    assert math.sqrt(err / max(norm, 1e-300)) < 1e-6, (
                        f"float64 {name} relative error {math.sqrt(err / norm):.3g} at rank {rank}, {what}, case {case}"
                    )
                for name in pooled:
                    pooled[name][i][0] += errs[name][i][0]
                    pooled[name][i][1] += errs[name][i][1]
    for backend in BACKENDS:
        for i, what in enumerate(("out", "dq", "dk", "dv")):
            ring, dense = (math.sqrt(pooled[n][i][0] / pooled[n][i][1]) for n in (backend + "32", "dense32"))
            assert ring <= 2 * dense, (
                f"float32 {what}: {backend} relative error {ring:.3g} > 2x dense float32 {dense:.3g}"
            )


def test_cp1_local_matches_dense_reference():
    from tests.unit.runtime.test_fused_attention import (
        one_thread,  # the spawned ranks of the other tests run one thread too
    )

    cases = _cases(1, 12)
    with one_thread():
        report = _check_cases(0, 1, cases)
    _assert_report(cases, [report])


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_cp2_matches_dense_reference_and_validates_lengths():
    cases = _cases(2, 16)
    reports = run_distributed(_cp2_worker, 2, cases, timeout=90)
    _assert_report(cases, [r[0] for r in reports])
    assert all(r[1] for r in reports)


def _cp4_worker(rank, world, cases, sub_cases):
    """The whole cp=4 world, then two interleaved cp=2 subgroups {0, 2} and {1, 3} of it (group ranks differ
    from global ranks there), in one spawn."""
    return _check_cases(rank, world, cases), _check_cases(rank, world, sub_cases, [[0, 2], [1, 3]])


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_cp4_and_cp2_subgroups_match_dense_reference():
    cases, sub_cases = _cases(4, 10), _cases(2, 3)[3:]
    reports = run_distributed(_cp4_worker, 4, cases, sub_cases, timeout=120)
    _assert_report(cases, [r[0] for r in reports])
    _assert_report(sub_cases, [r[1] for r in reports])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(cp=st.integers(1, 4), units=st.lists(st.integers(1, 5), min_size=1, max_size=5), dim=st.integers(0, 2))
def test_zigzag_round_trip(cp, units, dim):
    cu = torch.tensor([0] + [2 * cp * sum(units[: i + 1]) for i in range(len(units))])
    shape = [3, 2, 5]
    shape[dim] = int(cu[-1])
    x = torch.randn(shape)
    parts = [ba.zigzag_shard(x, cu, cp, r, dim) for r in range(cp)]
    assert all(p.shape[dim] == cu[-1] // cp for p in parts)
    assert torch.equal(ba.zigzag_unshard(parts, cu, cp, dim), x)


def test_zigzag_chunk_order():
    rows = torch.arange(16)
    cu = torch.tensor([0, 8, 16])
    assert ba.zigzag_shard(rows, cu, 2, 0, 0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert ba.zigzag_shard(rows, cu, 2, 1, 0).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]


def _qkv(S=2, T=8, H=4, hkv=2, D=4, dtype=torch.float32):
    return torch.zeros(S, T, H, D, dtype=dtype), torch.zeros(S, T, hkv, D), torch.zeros(S, T, hkv, D)


@pytest.mark.parametrize(
    "args, match",
    [
        (lambda q, k, v: (q[0], k, v, torch.tensor([0, 8])), "q must be a 4-D tensor"),
        (lambda q, k, v: (q, k[..., :2], v, torch.tensor([0, 8])), "k and v must have the same shape"),
        (lambda q, k, v: (q, k[:, :4], v[:, :4], torch.tensor([0, 8])), "does not fit q"),
        (lambda q, k, v: (q, k[:1], v[:1], torch.tensor([0, 8])), "does not fit q"),
        (lambda q, k, v: (q[:, :, :3], k, v, torch.tensor([0, 8])), "divisible by k/v heads Hkv=2"),
        (lambda q, k, v: (q.double(), k, v, torch.tensor([0, 8])), "share one floating dtype"),
        (lambda q, k, v: (q.long(), k.long(), v.long(), torch.tensor([0, 8])), "share one floating dtype"),
        (lambda q, k, v: (q, k, v, torch.tensor([0, 6])), "must equal T\\*cp = 8\\*1 = 8"),
        (lambda q, k, v: (q, k, v, torch.tensor([1, 8])), "must start at 0"),
        (lambda q, k, v: (q, k, v, torch.tensor([0, 4, 4, 8])), "strictly increasing"),
        (lambda q, k, v: (q, k, v, torch.tensor([0, 3, 8])), "multiple of 2\\*cp_size=2"),
        (lambda q, k, v: (q, k, v, torch.tensor([0.0, 8.0])), "integer dtype"),
        (lambda q, k, v: (q, k, v, torch.tensor([[0, 8]])), "1-D integer tensor"),
    ],
)
def test_bad_input_raises_value_error(args, match):
    with pytest.raises(ValueError, match=match):
        ba.branch_attention(*args(*_qkv()))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, cu: ba.zigzag_shard(x, cu, 0, 0, 0), "cp_size must be a positive int"),
        (lambda x, cu: ba.zigzag_shard(x, cu, 2, 2, 0), "cp_rank must be an int in \\[0, 2\\)"),
        (lambda x, cu: ba.zigzag_shard(x, cu, 2, 0, 3), "dim=3 is out of range"),
        (lambda x, cu: ba.zigzag_shard(x, cu, 2, 0, 1), "must equal cu_seqlens\\[-1\\]=8"),
        (lambda x, cu: ba.zigzag_shard(x, cu, 4, 0, 0), "multiple of 2\\*cp_size=8"),
        (lambda x, cu: ba.zigzag_unshard([x[:4]], cu, 2, 0), "expected 2, got 1"),
        (lambda x, cu: ba.zigzag_unshard([x[:4], x[:3]], cu, 2, 0), "parts\\[1\\] has shape"),
    ],
)
def test_zigzag_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.zeros(8, 3), torch.tensor([0, 4, 8]))


def _fail_on_rank_1(rank, world):
    if rank == 1:
        raise RuntimeError("deliberate failure")
    dist.barrier()  # rank 0 blocks here until the harness kills it


def _hang_on_rank_0(rank, world):
    if rank == 0:
        import time

        time.sleep(600)
    return rank


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_run_distributed_names_the_failing_rank_and_never_hangs():
    from tests.support.distributed import DistributedTestError

    with pytest.raises(DistributedTestError, match="(?s)failed on rank 1 of 2.*RuntimeError: deliberate failure"):
        run_distributed(_fail_on_rank_1, 2, timeout=30)
    with pytest.raises(DistributedTestError, match=r"ranks \[0[, 1]*\] did not finish within 6 s"):
        run_distributed(_hang_on_rank_0, 2, timeout=6)
