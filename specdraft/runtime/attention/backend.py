"""Which branch-attention backend runs where: a fused kernel (ops.py) where torch has its op, the dtype
suits it and a probe call matches the reference on the device, else the reference. Owns the order of preference,
the probe, the reasons for each rejection and the SPECDRAFT_ATTENTION_BACKEND override."""

from __future__ import annotations

import os

import torch

from specdraft.runtime.attention.fused import FusedAttention
from specdraft.runtime.attention.ops import CpuFlash, CudnnDense, FlashVarlen
from specdraft.runtime.attention.reference import ReferenceAttention

ENV = "SPECDRAFT_ATTENTION_BACKEND"
REFERENCE = "reference"
_KERNELS = {k.name: k for k in (CudnnDense, FlashVarlen, CpuFlash)}
BACKENDS = (*_KERNELS, REFERENCE)
# Preference per device type. CUDA: cuDNN first (SDPA's default there and the fastest measured on an H200,
# docs/branch_attention.md "Backends"), varlen flash second. CPU: the flash-for-CPU op, 2.2x faster than the
# reference on the benchmark's shape (docs/branch_attention.md "Benchmark"); fused ops take only the dtypes listed.
_ORDER = {"cuda": ("fused-cudnn", "fused-flash"), "cpu": ("fused-cpu-flash",)}
_DTYPES = {"cuda": (torch.bfloat16, torch.float16), "cpu": (torch.float64, torch.float32, torch.bfloat16)}
# cuDNN builds an execution graph per new shape (several hundred ms: sgl-project/sglang#4650) and a dense kernel
# needs one call per run of equal-length sequences. So cuDNN takes the calls whose sequences all share one length
# (a fixed-shape training loop then hits torch's graph cache); mixed lengths go to varlen flash, which has neither
# per-shape builds nor per-run calls, when it passed its probe.
MAX_DENSE_RUNS = 1

_instances: dict[str, object] = {}
_verdicts: dict[tuple, str | None] = {}  # (name, device, dtype, head_dim) -> None if usable, else why not


def requested_backend(backend: str | None) -> str:
    """The backend asked for: the argument, else $SPECDRAFT_ATTENTION_BACKEND, else 'auto'."""
    name = backend or os.environ.get(ENV) or "auto"
    if name != "auto" and name not in BACKENDS:
        raise ValueError(
            f"attention backend {name!r} is unknown; use auto or one of {', '.join(BACKENDS)} "
            f"(argument backend= or ${ENV})"
        )
    return name


def verdict(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """None if kernel `name` can run blocks of this device, dtype and head_dim; else the reason it cannot."""
    if name == REFERENCE:
        return None
    device = torch.device(device)
    key = (name, device, dtype, head_dim)
    if key not in _verdicts:
        _verdicts[key] = _check(name, device, dtype, head_dim)
    return _verdicts[key]


def _check(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    if name not in _ORDER.get(device.type, ()):
        return f"{name} does not run on {device.type}"
    if dtype not in _DTYPES[device.type]:
        return f"{name} takes {', '.join(str(d) for d in _DTYPES[device.type])}, not {dtype}"
    problem = _KERNELS[name].available()
    return problem if problem else _probe(name, device, dtype, head_dim)


def kernel(name: str):
    """The shared instance of block kernel `name` (it keeps per-device tensors a probe call returned)."""
    if name not in _instances:
        _instances[name] = _KERNELS[name]()
    return _instances[name]


def choose(device, dtype, head_dim: int, num_runs: int = 1, backend: str | None = None):
    """(kernel or None for the reference, backend name) for one call. A forced fused backend that cannot run
    raises ValueError with the reason; 'auto' takes the first usable one in _ORDER."""
    device = torch.device(device)
    name = requested_backend(backend)
    if name == REFERENCE:
        return None, REFERENCE
    if name != "auto":
        why = verdict(name, device, dtype, head_dim)
        if why:
            raise ValueError(f"attention backend {name} cannot run here: {why}")
        return kernel(name), name
    usable = [n for n in _ORDER.get(device.type, ()) if verdict(n, device, dtype, head_dim) is None]
    if not usable:
        return None, REFERENCE
    if len(usable) > 1 and usable[0] == "fused-cudnn" and num_runs > MAX_DENSE_RUNS:
        usable = usable[1:]
    return kernel(usable[0]), usable[0]


def describe(device, dtype, head_dim: int, backend: str | None = None) -> str:
    """The backend a call with one run of sequences would use, plus (under 'auto') why better ones were passed over."""
    device = torch.device(device)
    _, chosen = choose(device, dtype, head_dim, backend=backend)
    if requested_backend(backend) != "auto":
        return chosen
    skipped = []
    for name in _ORDER.get(device.type, ()):
        if name == chosen:
            break
        skipped.append(f"{name}: {verdict(name, device, dtype, head_dim)}")
    return chosen + (f" ({'; '.join(skipped)})" if skipped else "")


class LoopbackRing:
    """A ring whose every hop returns to this process: step i holds this rank's own K/V in block pattern
    kinds[i]. It runs the 'early' and 'late' patterns of a cp > 1 ring without other processes (probe, tests);
    the dK/dV accumulator comes back as the sum over all steps."""

    def __init__(self, kinds=("own", "early", "late")):
        self.kinds, self.size, self.rank = tuple(kinds), len(kinds), 0

    def kind(self, step: int) -> str:
        return self.kinds[step]

    def shift(self, buf: torch.Tensor, phase: str):
        return _Done(buf)


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


def probe_case(device, dtype, head_dim: int, seed: int = 0):
    """A small case that touches every code path of a kernel: two runs of sequences (8, 8 | 12 local rows),
    S=2 TTT steps, GQA (2 kv heads x 2), the own/early/late patterns. (q, k, v, dout, cu, ring)."""
    ring = LoopbackRing()
    cu = [c * ring.size for c in (0, 8, 16, 28)]  # global, so cu // ring.size is the local layout above
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 28, h, head_dim) for h in (4, 2, 2, 4)]
    q, k, v, dout = (torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in shapes)
    return q, k, v, dout, cu, ring


def run_case(fn, q, k, v, dout, *args):
    """(out, dq, dk, dv) of autograd function `fn` applied to (q, k, v, *args)."""
    with torch.enable_grad(), torch.autocast(q.device.type, enabled=False):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = fn.apply(*leaves, *args)
        return [out.detach(), *torch.autograd.grad(out, leaves, dout)]


def _probe(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Run kernel `name` on probe_case against the reference (same inputs, fp32 math); None if it matches."""
    q, k, v, dout, cu, ring = probe_case(device, dtype, head_dim)
    scale = head_dim**-0.5
    # Tiny CPU tensors gain nothing from threads, and on a loaded machine OpenMP's spinning made them 500x slower.
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        want = run_case(ReferenceAttention, q, k, v, dout, cu, ring, scale)
        got = run_case(FusedAttention, q, k, v, dout, cu, ring, scale, kernel(name))
    except (RuntimeError, NotImplementedError, TypeError, ValueError, KeyError) as e:
        return f"{name} probe call failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        torch.set_num_threads(threads)
    tol = 1e-10 if dtype == torch.float64 else 1e-4 if dtype == torch.float32 else 3e-2
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
        if not err <= tol:  # also catches nan
            return f"{name} probe: {what} differs from the reference by {err:.3g} (relative; allowed {tol:g})"
    return None
