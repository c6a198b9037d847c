"""Benchmark of branch_attention (one zigzag ring pass for all TTT steps) against (a) all-gather K/V + dense masked
attention and (b) one ring pass per TTT step: peak memory, bytes sent and forward+backward wall time per rank.
`ring` is the plain-torch reference path, `fused` the default one (a fused kernel per block where one is usable:
on CPU the flash-for-CPU op), and both are also timed alternately in the same processes (`fused/ring same proc`).

    .venv/bin/python benchmarks/branch_attention.py                      # CPU, gloo: cp 2 4, 8K/16K/32K tokens
    .venv/bin/python benchmarks/branch_attention.py --device cuda --backend nccl --cp 2 4 8 --tokens 32768 131072

Every (cp, tokens, method) runs in a fresh set of processes so the peak of one cannot hide another's.
Peak memory per rank is measured after the inputs (q, k, v, dout) exist: on CPU, peak RSS (getrusage ru_maxrss)
minus the RSS just before the timed call; on CUDA, torch.cuda.max_memory_allocated minus memory_allocated.
Bytes sent per rank: branch_attention's send counter for the rings; for (a), what a ring all-gather of the trunk
K/V plus a ring reduce-scatter of its gradient send, (cp-1) shards each. Wall time of forward+backward is the
fastest of --repeat runs; cpu s is the process CPU time (all threads) of that run, which other load on a shared
machine disturbs less than wall time. Figures are the max over ranks; x/a and x/b are this row's figure divided
by baseline (a)'s and (b)'s, so mem/a of a ring row is ring peak / all-gather peak.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.support.distributed, the house harness
from specdraft.runtime.attention import backend as attention_backend
from specdraft.runtime.attention import branch as ba
from specdraft.runtime.attention import reference as ref
from tests.support.distributed import run_distributed

_GATHER = {"bytes": 0}


class _GatherTrunk(torch.autograd.Function):
    """(2, T, Hkv, D) local trunk K/V -> (2, N, Hkv, D) whole batch in sequence order; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, kv, cu_t, group):
        cp = dist.get_world_size(group)
        parts = torch.empty((cp * kv.shape[0], *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
        dist.all_gather_single(parts, kv.contiguous(), group=group)
        parts = parts.view(cp, *kv.shape)
        _GATHER["bytes"] += (cp - 1) * kv.numel() * kv.element_size()
        ctx.cu_t, ctx.group, ctx.rank = cu_t, group, dist.get_rank(group)
        return ba.zigzag_unshard(list(parts), cu_t, cp, dim=1)

    @staticmethod
    def backward(ctx, grad):
        cp = dist.get_world_size(ctx.group)
        shards = torch.cat([ba.zigzag_shard(grad, ctx.cu_t, cp, r, dim=1) for r in range(cp)])
        out = torch.empty((shards.shape[0] // cp, *shards.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_single(out, shards, group=ctx.group)
        _GATHER["bytes"] += (cp - 1) * out.numel() * out.element_size()
        return out, None, None


def allgather_dense(q, k, v, cu, group, scale):
    """Baseline (a): gathered trunk K/V and, per sequence, a dense score matrix of the local queries against
    the whole sequence plus the branch diagonal, masked and softmaxed by plain autograd (GQA without repeats)."""
    S, T, H, D = q.shape
    hkv, g = k.shape[2], H // k.shape[2]
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    kv = _GatherTrunk.apply(torch.stack((k[0], v[0])), torch.tensor(cu), group)  # (2, N, Hkv, D)
    outs, lo = [], 0
    for start, end in zip(cu, cu[1:]):
        n, c = end - start, (end - start) // (2 * cp)
        pos = torch.cat(
            [torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]
        ).to(q.device)
        qb = q[:, lo : lo + 2 * c].reshape(S, 2 * c, hkv, g, D) * scale
        s_t = torch.einsum("stngd,knd->stngk", qb, kv[0, start:end])  # (S, 2c, Hkv, G, n)
        s_t = s_t.masked_fill((torch.arange(n, device=q.device) > pos[:, None])[None, :, None, None], -math.inf)
        s_b = torch.einsum("stngd,itnd->stngi", qb, k[1:, lo : lo + 2 * c])  # (S, 2c, Hkv, G, S-1)
        later = torch.arange(1, S, device=q.device)[None, :] > torch.arange(S, device=q.device)[:, None]
        p = torch.softmax(torch.cat([s_t, s_b.masked_fill(later[:, None, None, None], -math.inf)], -1), -1)
        o = torch.einsum("stngk,knd->stngd", p[..., :n], kv[1, start:end])
        o = o + torch.einsum("stngi,itnd->stngd", p[..., n:], v[1:, lo : lo + 2 * c])
        outs.append(o.reshape(S, 2 * c, H, D))
        lo += 2 * c
    return torch.cat(outs, 1)


class _PerStepRing(torch.autograd.Function):
    """Baseline (b): the same kernels as branch_attention, but one trunk ring pass per TTT step."""

    @staticmethod
    def forward(ctx, q, k, v, cu, ring, scale):
        S, T, H, D = q.shape
        hkv, g = k.shape[2], H // k.shape[2]
        cdt = torch.promote_types(q.dtype, torch.float32)
        kv = torch.stack((k[0], v[0])).transpose(1, 2).contiguous()
        kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))
        cu_local = [c // ring.size for c in cu]
        outs, lses = [], []
        for j in range(S):
            qh = ref.heads_first(q[j : j + 1], hkv, cdt, scale)  # (Hkv, T, G, D)
            o, lse = ref.trunk_forward(qh, kv, cu_local, ring, ref.block_rows(H))
            if j:
                ref.branch_forward(
                    qh.view(hkv, T, 1, g, D),
                    kb[:, :, :j],
                    vb[:, :, :j],
                    o.view(hkv, T, 1, g, D),
                    lse.view(hkv, T, 1, g),
                    first_step=j,
                )
            outs.append(ref.heads_last(o, 1, q.dtype))
            lses.append(lse)
        out = torch.cat(outs)
        ctx.save_for_backward(q, k, v, out, torch.stack(lses))
        ctx.cu_local, ctx.ring, ctx.scale = cu_local, ring, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lses = ctx.saved_tensors
        S, T, H, D = q.shape
        hkv, g = k.shape[2], H // k.shape[2]
        kv = torch.stack((k[0], v[0])).transpose(1, 2).contiguous()
        kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))
        dq, dkv = torch.empty_like(q), 0
        dkb, dvb = torch.zeros_like(kb, dtype=lses.dtype), torch.zeros_like(vb, dtype=lses.dtype)
        for j in range(S):
            prod = dout[j : j + 1].to(lses.dtype) * out[j : j + 1].to(lses.dtype)
            delta = ref.heads_first(prod.sum(-1, keepdim=True), hkv)[..., 0]
            qh = ref.heads_first(q[j : j + 1], hkv, lses.dtype, ctx.scale)
            doh = ref.heads_first(dout[j : j + 1], hkv, lses.dtype)
            dqh, dkv_j = ref.trunk_backward(qh, kv, doh, lses[j], delta, ctx.cu_local, ctx.ring, ref.block_rows(H))
            dkv = dkv + dkv_j
            if j:
                five = (hkv, T, 1, g, D)
                dq5, dk_j, dv_j = ref.branch_backward(
                    qh.view(five),
                    kb[:, :, :j],
                    vb[:, :, :j],
                    doh.view(five),
                    lses[j].view(five[:-1]),
                    delta.view(five[:-1]),
                    first_step=j,
                )
                dqh.view(five).add_(dq5)
                dkb[:, :, :j] += dk_j
                dvb[:, :, :j] += dv_j
            dq[j] = ref.heads_last(dqh.mul_(ctx.scale), 1, q.dtype)[0]
        dk = torch.cat([dkv[0].transpose(0, 1)[None], dkb.permute(2, 1, 0, 3)]).to(k.dtype)
        dv = torch.cat([dkv[1].transpose(0, 1)[None], dvb.permute(2, 1, 0, 3)]).to(v.dtype)
        return dq, dk, dv, None, None, None


METHODS = {
    "ring": lambda q, k, v, cu, group, scale: ba.branch_attention(
        q, k, v, torch.tensor(cu), group, scale, backend="reference"
    ),
    "fused": lambda q, k, v, cu, group, scale: ba.branch_attention(q, k, v, torch.tensor(cu), group, scale),
    "a_allgather": allgather_dense,
    "b_per_step": lambda q, k, v, cu, group, scale: _PerStepRing.apply(q, k, v, cu, ba._Ring(group), scale),
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _worker(rank, world, cfg):
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    group, fn, S, dtype = dist.group.WORLD, METHODS[cfg["method"]], cfg["steps"], getattr(torch, cfg["dtype"])
    scale = cfg["head_dim"] ** -0.5

    def inputs(total):
        gen = torch.Generator(device=device).manual_seed(rank)
        shapes = [(S, total // world, h, cfg["head_dim"]) for h in (cfg["heads"], cfg["kv_heads"], cfg["kv_heads"])]
        q, k, v = (torch.randn(s, generator=gen, device=device, dtype=dtype).requires_grad_() for s in shapes)
        return q, k, v, torch.randn(shapes[0], generator=gen, device=device, dtype=dtype)

    def run(q, k, v, dout, cu):
        fn(q, k, v, cu, group, scale).backward(dout)

    small = 2 * world * 8
    run(*inputs(small), [0, small])  # warm-up: lazy init of kernels and communicators
    seq = cfg["seq_len"]
    cu = list(range(0, cfg["tokens"] + 1, seq))
    q, k, v, dout = inputs(cfg["tokens"])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    times, cpu = [], []
    for _ in range(cfg["repeat"]):  # identical runs: the same peak and bytes; the fastest time is least disturbed
        ba.count_bytes(True)
        _GATHER["bytes"] = 0
        q.grad = k.grad = v.grad = None
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        run(q, k, v, dout, cu)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    sent = ba.bytes_sent()
    result = {"peak": peak, "sent": sent["fwd"] + sent["bwd"] + _GATHER["bytes"], "time": min(times), "cpu": min(cpu)}
    if cfg["method"] == "fused":  # after its peak is taken: fused and the reference alternately, same processes
        same = {m: [] for m in ("fused", "ring")}
        for _ in range(cfg["repeat"]):
            for m in same:
                q.grad = k.grad = v.grad = None
                dist.barrier()
                t0 = time.perf_counter()
                METHODS[m](q, k, v, cu, group, scale).backward(dout)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                same[m].append(time.perf_counter() - t0)
        result["same"] = min(same["fused"]) / min(same["ring"])
        result["backend"] = attention_backend.describe(device, dtype, cfg["head_dim"])
    return result


def _measure(cfg, timeout):
    per_rank = run_distributed(_worker, cfg["cp"], cfg, timeout=timeout, backend=cfg["backend"])
    return {key: max(r[key] for r in per_rank) for key in per_rank[0]}  # max over ranks (a name: all equal)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cp", type=int, nargs="+", default=[2, 4])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768], help="total packed tokens")
    p.add_argument("--seq-len", type=int, default=2048, help="length of each packed sequence")
    p.add_argument("--steps", type=int, default=3, help="TTT steps S")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--repeat", type=int, default=2, help="timed runs per configuration; the fastest is reported")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    print(
        f"S={args.steps} H={args.heads} Hkv={args.kv_heads} D={args.head_dim} {args.dtype} seq_len={args.seq_len} "
        f"device={args.device} backend={args.backend} repeat={args.repeat}; per rank (max over ranks); "
        f"x/a, x/b, x/ring = this row / baseline a, b, the reference ring; same proc = fused/ring wall time, "
        f"timed alternately in the same processes"
    )
    cols = [
        "cp",
        "tokens",
        "method",
        "peak MiB",
        "sent MiB",
        "wall s",
        "cpu s",
        "mem/a",
        "mem/b",
        "sent/a",
        "sent/b",
        "wall/a",
        "wall/b",
        "cpu/a",
        "cpu/b",
        "mem/ring",
        "wall/ring",
        "cpu/ring",
        "same proc",
    ]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    fused_backend = None
    for cp in args.cp:
        for tokens in args.tokens:
            base = dict(vars(args), cp=cp, tokens=tokens)
            r = {m: _measure(dict(base, method=m), args.timeout) for m in METHODS}
            fused_backend = r["fused"]["backend"]
            for m in ("a_allgather", "b_per_step", "ring", "fused"):
                fig = [
                    f"{r[m]['peak'] / 2**20:.1f}",
                    f"{r[m]['sent'] / 2**20:.1f}",
                    f"{r[m]['time']:.2f}",
                    f"{r[m]['cpu']:.2f}",
                ]
                ratios = [
                    f"{r[m][key] / r[b][key]:.2f}" if r[b][key] else "-"
                    for key in ("peak", "sent", "time", "cpu")
                    for b in ("a_allgather", "b_per_step")
                ]
                ratios += [f"{r[m][key] / r['ring'][key]:.2f}" for key in ("peak", "time", "cpu")]
                ratios.append(f"{r[m]['same']:.2f}" if "same" in r[m] else "-")
                print(f"| {cp} | {tokens} | {m} | " + " | ".join(fig + ratios) + " |", flush=True)
    print(f"fused backend: {fused_backend}")


if __name__ == "__main__":
    main()
