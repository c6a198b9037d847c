"""The accelerator catalogue: HBM size and bandwidth, dense bf16 and fp8 peaks, intra- and inter-node bandwidth.

Sources: NVIDIA datasheets (A100, H100 SXM, H200, DGX B200; DGX systems give each GPU its own InfiniBand NIC:
200 Gb/s on DGX A100, 400 Gb/s on DGX H100/H200/B200); `cpu` is a notional local-run device. HBM is what NVML
reports (nvidia-smi: A100 80GB 81,920 MiB, H100 80GB 81,559 MiB, H200 143,771 MiB; tabulated at
https://thundergolfer.com/blog/nvidia-gpu-memory-capacity): the datasheets' "80GB" are binary gigabytes.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
GIB = 2**30
MIB = 2**20


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One accelerator kind."""

    name: str
    hbm_bytes: int
    hbm_bw: float  # bytes/s
    peak_flops: float  # dense bf16 FLOP/s
    link_bw: float  # intra-node (NVLink) bytes/s per direction
    net_bw: float  # inter-node bytes/s per GPU per direction (its own NIC)
    fp8_flops: float | None = None  # dense fp8 FLOP/s; None where the GPU has no FP8 tensor cores
    is_gpu: bool = True


CATALOGUE: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu(name="a100-80gb", hbm_bytes=81920 * MIB, hbm_bw=2.039e12, peak_flops=312e12, link_bw=300e9, net_bw=25e9),
        Gpu(
            name="h100-80gb",
            hbm_bytes=81559 * MIB,
            hbm_bw=3.35e12,
            peak_flops=989e12,
            link_bw=450e9,
            net_bw=50e9,
            fp8_flops=1979e12,
        ),
        Gpu(
            name="h200-141gb",
            hbm_bytes=143771 * MIB,
            hbm_bw=4.8e12,
            peak_flops=989e12,
            link_bw=450e9,
            net_bw=50e9,
            fp8_flops=1979e12,
        ),
        Gpu(
            name="b200",
            hbm_bytes=180 * GB,
            hbm_bw=8.0e12,
            peak_flops=2250e12,
            link_bw=900e9,
            net_bw=50e9,
            fp8_flops=4500e12,
        ),
        # Local runs: one "device" per process on the host's CPU and RAM.
        Gpu(name="cpu", hbm_bytes=4 * GIB, hbm_bw=20e9, peak_flops=100e9, link_bw=10e9, net_bw=1e9, is_gpu=False),
    )
}


def describe() -> str:
    """One line per catalogue entry, for `specdraft explain cluster.gpu`."""
    return "\n".join(
        f"{g.name}: {g.hbm_bytes / GB:.0f} GB HBM, {g.hbm_bw / 1e12:.2f} TB/s, "
        f"{g.peak_flops / 1e12:.0f} TFLOP/s bf16"
        + (f", {g.fp8_flops / 1e12:.0f} TFLOP/s fp8" if g.fp8_flops else "")
        + f", link {g.link_bw / 1e9:.0f} GB/s, network {g.net_bw / 1e9:.0f} GB/s per GPU"
        for g in CATALOGUE.values()
    )
