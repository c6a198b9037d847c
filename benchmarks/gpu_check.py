"""The project's GPU check, one command on a CUDA machine (scripts/gpu-check.sh installs what it needs):

(a) branch attention against a dense float64 reference on the device: out, dq, dk, dv errors per dtype and
    backend, beside the same math in plain torch at that dtype;
(b) branch attention forward+backward at the benchmark shape (S=3, 8 x 4096 packed tokens, H=32, Hkv=8, D=128,
    bf16): ms and peak GiB beside the SDPA floor (S causal calls, default backend) and FlexAttention over the
    whole TTT mask, all timed in this process;
(c) short co-training runs of layouts/one-gpu.yaml with and without the draft (`specdraft launch --executor
    local`): step time, tokens/s, MFU, draft overhead, beside a plain PyTorch Llama step of the same shape
    (benchmarks/plain_llama.py) timed in this run.

  python benchmarks/gpu_check.py [--parts a b c]      # CUDA
  python benchmarks/gpu_check.py --smoke              # every part on CPU at a tiny shape (tests/dist/test_gpu_check.py)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from plain_llama import Shape, plain_step_seconds  # this script's folder is on sys.path

from specdraft.runtime.attention import backend as attention_backend
from specdraft.runtime.attention.branch import branch_attention

LAYOUT = Path(__file__).resolve().parents[1] / "layouts" / "one-gpu.yaml"
# (c) on CPU: the one-GPU layout shrunk to seconds per step (8 layers: the draft's default taps must be distinct).
SMOKE_OVERRIDES = [
    "cluster.gpu=cpu",
    "training.dtype=fp32",
    "model.num_layers=8",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.num_attention_heads=4",
    "model.num_query_groups=2",
    "model.vocab_size=128",
    "model.seq_length=128",
    "training.global_batch_size=2",
]
FULL = dict(steps=3, seqs=[4096] * 8, heads=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16)
SMOKE = dict(steps=3, seqs=[64] * 2, heads=4, kv_heads=2, head_dim=16, dtype=torch.float32)


def dense_reference(q, k, v, cu, scale):
    """Dense TTT attention on the whole batch with an explicit (S*N, S*N) mask: the float64 yardstick."""
    S, N, H, D = q.shape
    g = H // k.shape[2]
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1, device=q.device), torch.tensor(cu).diff().to(q.device))
    row = torch.arange(N, device=q.device)
    trunk = (seq[:, None] == seq[None, :]) & (row[None, :] <= row[:, None])
    allowed = torch.zeros(S, N, S, N, dtype=torch.bool, device=q.device)
    for j in range(S):
        allowed[j, :, 0] = trunk
        for i in range(1, j + 1):
            allowed[j, :, i] = torch.eye(N, dtype=torch.bool, device=q.device)
    qf = q.permute(2, 0, 1, 3).reshape(H, S * N, D)
    kf, vf = (x.repeat_interleave(g, 2).permute(2, 0, 1, 3).reshape(H, S * N, D) for x in (k, v))
    s = (qf @ kf.transpose(1, 2) * scale).masked_fill(~allowed.reshape(S * N, S * N), float("-inf"))
    return (torch.softmax(s, -1) @ vf).reshape(H, S, N, D).permute(1, 2, 0, 3)


def _grads(fn, q, k, v, dout):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, dout)]


def _inputs(cfg, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = sum(cfg["seqs"])
    shapes = [
        (cfg["steps"], n, h, cfg["head_dim"]) for h in (cfg["heads"], cfg["kv_heads"], cfg["kv_heads"], cfg["heads"])
    ]
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in shapes]


def _cu(seqs):
    cu = [0]
    for n in seqs:
        cu.append(cu[-1] + n)
    return cu


# ----------------------------------------------------------------------------------------------------- (a)
def part_a(device, smoke: bool) -> None:
    cfg = dict(SMOKE if smoke else FULL, seqs=[32, 16, 48, 32] if smoke else [384, 128, 256, 256])
    cu = _cu(cfg["seqs"])
    cu_t, scale = torch.tensor(cu, device=device), cfg["head_dim"] ** -0.5
    q, k, v, dout = _inputs(cfg, device, torch.float64)
    want = _grads(lambda *x: dense_reference(*x, cu, scale), q, k, v, dout)
    print(
        f"(a) branch attention vs dense float64 on {device}: S={cfg['steps']}, sequences {cfg['seqs']}, "
        f"H={cfg['heads']}, Hkv={cfg['kv_heads']}, D={cfg['head_dim']}; relative errors (norm) out/dq/dk/dv"
    )
    print("| dtype | backend | out | dq | dk | dv | plain torch at this dtype (out/dq/dk/dv) |")
    print("|---|---|---|---|---|---|---|")
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        low = [x.to(dtype) for x in (q, k, v, dout)]
        plain = _grads(lambda *x: dense_reference(*x, cu, scale), *low)
        yard = "/".join(f"{_rel(a, b):.2g}" for a, b in zip(plain, want))
        for name in attention_backend.BACKENDS:
            why = attention_backend.verdict(name, device, dtype, cfg["head_dim"])
            if why:
                if name in attention_backend._ORDER.get(device.type, ()):
                    print(f"| {_short(dtype)} | {name} | n/a: {why} | | | | |")
                continue
            got = _grads(lambda *x: branch_attention(*x, cu_t, softmax_scale=scale, backend=name), *low)  # noqa: B023
            print(
                f"| {_short(dtype)} | {name} | "
                + " | ".join(f"{_rel(a, b):.2g}" for a, b in zip(got, want))
                + f" | {yard} |",
                flush=True,
            )
    print(
        "auto picks: "
        + ", ".join(
            f"{_short(d)} {attention_backend.describe(device, d, cfg['head_dim'])}"
            for d in (torch.float64, torch.float32, torch.bfloat16)
        )
    )


def _rel(a, b) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def _short(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------------------------------- (b)
def _timed(fn, device, reps: int, warmup: int = 2):
    """(min seconds, peak bytes above what was allocated before) of fn(); peak only on CUDA."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    return min(times), peak


def part_b(device, smoke: bool, reps: int) -> None:
    cfg = SMOKE if smoke else FULL
    S, L, B = cfg["steps"], cfg["seqs"][0], len(cfg["seqs"])
    H, hkv, D, dtype = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["dtype"]
    q, k, v, dout = _inputs(cfg, device, dtype)
    cu = torch.tensor(_cu(cfg["seqs"]), device=device)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    print(
        f"\n(b) forward+backward on {device}: S={S}, {B} x {L} packed tokens, H={H}, Hkv={hkv}, D={D}, "
        f"{_short(dtype)}; fastest of {reps}; peak = allocated above the inputs"
    )
    rows = []

    def ours(backend):
        def run():
            for x in leaves:
                x.grad = None
            branch_attention(*leaves, cu, backend=backend).backward(dout)

        return run

    default = attention_backend.describe(device, dtype, D)
    rows.append((f"branch_attention (auto: {default})", ours(None)))
    for name in attention_backend.BACKENDS:
        if name != default.split(" ")[0] and not attention_backend.verdict(name, device, dtype, D):
            rows.append((f"branch_attention ({name})", ours(name)))

    # (S, B, heads, L, D) for q and dout, (B, Hkv, L, D) for the trunk K/V
    qs, dos = (x.detach().view(S, B, L, H, D).transpose(2, 3) for x in (q, dout))
    floor_leaves = [
        qs.clone().requires_grad_(),
        *(x.detach()[0].view(B, L, hkv, D).transpose(1, 2).clone().requires_grad_() for x in (k, v)),
    ]

    def floor():  # the trunk work alone: S causal calls, default SDPA backend (cuDNN attention on Hopper)
        for x in floor_leaves:
            x.grad = None
        fq, fk, fv = floor_leaves
        outs = [F.scaled_dot_product_attention(fq[j], fk, fv, is_causal=True, enable_gqa=True) for j in range(S)]
        torch.autograd.backward(outs, [dos[j] for j in range(S)])

    rows.append(("SDPA floor (S causal calls, default backend)", floor))
    rows.append(("FlexAttention, whole TTT mask", _flex(q, k, v, dout, cfg, device)))
    print("| method | ms | peak GiB | x floor (time) | x floor (peak) | x Flex (time) |\n|---|---|---|---|---|---|")
    results = {}
    for name, fn in rows:
        if not callable(fn):
            results[name] = fn
            continue
        try:
            results[name] = _timed(fn, device, max(1, reps // 3) if "(reference)" in name else reps)
        except (RuntimeError, NotImplementedError) as e:  # report and go on: the other rows still mean something
            results[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    floor_t, floor_peak = results["SDPA floor (S causal calls, default backend)"]
    flex_r = results["FlexAttention, whole TTT mask"]
    for name, r in results.items():
        if isinstance(r, str):
            print(f"| {name} | {r} | | | | |")
            continue
        t, peak = r
        gib = f"{peak / 2**30:.2f}" if peak is not None else "n/a (CPU)"
        mem = f"{peak / floor_peak:.2f}" if peak is not None and floor_peak else "-"
        vs_flex = f"{t / flex_r[0]:.2f}" if not isinstance(flex_r, str) else "-"
        print(f"| {name} | {t * 1e3:.1f} | {gib} | {t / floor_t:.2f} | {mem} | {vs_flex} |", flush=True)


def _flex(q, k, v, dout, cfg, device):
    """A fn timing compiled FlexAttention over the whole (S*N)^2 TTT mask (block mask built once, outside the
    timing), or the reason it cannot run here."""
    if device.type != "cuda":
        return "n/a: FlexAttention has no backward on CPU (torch 2.13)"
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    S, N = q.shape[0], q.shape[1]
    seq = torch.repeat_interleave(
        torch.arange(len(cfg["seqs"]), device=device), torch.tensor(cfg["seqs"], device=device)
    )

    def mask_mod(b, h, qi, ki):  # flattened index = step * N + row
        qj, qr, kj, kr = qi // N, qi % N, ki // N, ki % N
        return ((kj == 0) & (seq[qr] == seq[kr]) & (kr <= qr)) | ((kj >= 1) & (kj <= qj) & (kr == qr))

    mask = create_block_mask(mask_mod, 1, 1, S * N, S * N, device=device)
    flat = [x.detach().permute(2, 0, 1, 3).reshape(1, x.shape[2], S * N, x.shape[3]) for x in (q, k, v, dout)]
    leaves = [x.clone().requires_grad_() for x in flat[:3]]
    compiled = torch.compile(flex_attention)

    def run():
        for x in leaves:
            x.grad = None
        compiled(*leaves, block_mask=mask, enable_gqa=True).backward(flat[3])

    return run


# ----------------------------------------------------------------------------------------------------- (c)
def part_c(device, smoke: bool, steps: int, skip: int) -> None:
    from specdraft.spec.gpus import CATALOGUE
    from specdraft.spec.load import load_layout

    overrides = SMOKE_OVERRIDES if smoke else []
    spec = load_layout(LAYOUT, overrides)
    m = spec.model
    shape = Shape(
        layers=m.num_layers,
        hidden=m.hidden_size,
        heads=m.num_attention_heads,
        kv_heads=m.num_query_groups or m.num_attention_heads,
        ffn=m.ffn_hidden_size,
        vocab=m.vocab_size,
    )
    rows, seq = spec.training.global_batch_size, m.seq_length
    tokens, peak = rows * seq, CATALOGUE[spec.cluster.gpu].peak_flops
    flops = shape.step_flops(tokens, seq)
    print(
        f"\n(c) one-GPU step: {LAYOUT.name} {' '.join(overrides)}; {rows} x {seq} tokens per step, "
        f"{shape.matmul_params() / 1e6:.3g}M matmul params; MFU = {flops / 1e12:.3g} TFLOP per step (target "
        f"only, nominal causal attention) / step time / {peak / 1e12:.3g} TFLOP/s ({spec.cluster.gpu}); median "
        f"of steps {skip + 1}..{steps}"
    )
    plain = "plain PyTorch (SDPA, " + ("fused AdamW, bf16 autocast)" if device.type == "cuda" else "AdamW, fp32)")
    results = {plain: plain_step_seconds(shape, seq, rows, device, steps=max(1, steps - skip), warmup=skip)}
    for label, extra in (("specdraft, no draft", ["draft.enabled=false"]), ("specdraft, with draft", [])):
        results[label] = _cotrain_step(overrides + extra, steps, skip)
    print("| run | step s | tokens/s | MFU | x plain | attention |\n|---|---|---|---|---|---|")
    plain = results[plain]
    for label, r in results.items():
        t, attention = (r, "SDPA") if isinstance(r, float) else r if isinstance(r, tuple) else (None, r)
        if t is None:
            print(f"| {label} | {attention} | | | | |")
            continue
        print(f"| {label} | {t:.3f} | {tokens / t:,.0f} | {flops / t / peak:.1%} | {t / plain:.2f} | {attention} |")
    base, draft = results["specdraft, no draft"], results["specdraft, with draft"]
    if isinstance(base, tuple) and isinstance(draft, tuple):
        print(f"draft overhead: {draft[0] / base[0] - 1:+.1%} step time")


def _cotrain_step(overrides, steps: int, skip: int):
    """(median step seconds, attention backends) of `specdraft launch` of the layout, or why it failed."""
    with tempfile.TemporaryDirectory(prefix="specdraft-gpu-check-") as tmp:
        run_dir = Path(tmp) / "run"
        argv = [
            sys.executable,
            "-m",
            "specdraft.cli",
            "launch",
            str(LAYOUT),
            *overrides,
            "--executor",
            "local",
            "--steps",
            str(steps),
            "--run-dir",
            str(run_dir),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        metrics = run_dir / "metrics.jsonl"
        if done.returncode != 0 or not metrics.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
            return f"failed (exit {done.returncode}): " + " / ".join(tail)
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = sorted(r["step_time_s"] for r in records[skip:]) or [math.nan]
    return times[len(times) // 2], records[-1].get("attention", "?")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    p.add_argument("--smoke", action="store_true", help="run on CPU at a tiny shape (checks the script itself)")
    p.add_argument("--reps", type=int, default=10, help="(b): timed runs per method, the fastest counts")
    p.add_argument("--steps", type=int, default=8, help="(c): optimizer steps per run")
    p.add_argument("--skip", type=int, default=3, help="(c): first steps left out of the median (warm-up)")
    args = p.parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        print("gpu_check: torch sees no CUDA device; use --smoke for the CPU run", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"specdraft GPU check on {name}, torch {torch.__version__}" + (" (smoke: tiny shapes)" if args.smoke else ""))
    if "a" in args.parts:
        part_a(device, args.smoke)
    if "b" in args.parts:
        part_b(device, args.smoke, args.reps)
    if "c" in args.parts:
        part_c(device, args.smoke, args.steps, args.skip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
