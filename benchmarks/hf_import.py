"""HF checkpoint import at tp4: bytes read and peak memory per rank, each against the rank's own parameter bytes.

Run: `.venv/bin/python benchmarks/hf_import.py [--layers 32] [--dtype bf16|fp32] [--keep DIR]`. Writes a Llama-shaped
checkpoint of about 0.5B parameters (hidden 1024, 16 heads in 8 KV groups, ffn 2816, vocabulary 50257, which tp4
pads to 50260) with random bf16 weights into a temp folder (names and shapes from transformers' own LlamaForCausalLM,
built on the meta device; shards of about 200 MB with an index), then on 4 gloo ranks builds the runtime's policy
from it (runtime/models/target.build_chunks with the checkpoint) and reports per rank:

- bytes read: the kernel's count for the process (/proc/self/io rchar) across the build, and the reader's own
  count of the bytes it asked for; each over the rank's parameter bytes (target: at most 1.1x);
- peak memory: the resident-set high-water mark across the build (VmHWM, reset first through /proc/self/clear_refs)
  less the resident set before it, over the rank's parameter bytes (target: at most 1.5x).

With --dtype fp32 the parameters are fp32 and every slice goes through the conversion buffer (reader.BLOCK_BYTES).
Linux only (/proc). Ranks load one after another, so one rank's reads never warm another's measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHAPE = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_attention_heads=16,
    num_key_value_heads=8,
    vocab_size=50257,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
TP = 4
SHARD_BYTES = 200 << 20


def write_checkpoint(folder: Path, layers: int) -> int:
    """Random bf16 weights under transformers' names and shapes; returns the parameter count."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.LlamaConfig(num_hidden_layers=layers, architectures=["LlamaForCausalLM"], **SHAPE)
    config.save_pretrained(folder)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in transformers.LlamaForCausalLM(config).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    weight_map, shard, size, count, total = {}, {}, 0, 0, 0
    names: list[str] = []

    def flush():
        name = f"model-{len(names) + 1:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({t: name for t in shard})
        names.append(name)

    for name, shape in shapes.items():
        tensor = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        if shard and size + tensor.nbytes > SHARD_BYTES:
            flush()
            shard, size = {}, 0
        shard[name], size, count, total = tensor, size + tensor.nbytes, count + tensor.numel(), total + tensor.nbytes
    flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return count


def plan_for(folder: Path, layers: int, dtype: str):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    s = SHAPE
    return compile(
        load_layout(
            None,
            [
                f"model.num_layers={layers}",
                f"model.hidden_size={s['hidden_size']}",
                f"model.ffn_hidden_size={s['intermediate_size']}",
                f"model.num_attention_heads={s['num_attention_heads']}",
                f"model.num_query_groups={s['num_key_value_heads']}",
                f"model.vocab_size={s['vocab_size']}",
                "model.seq_length=128",
                f"model.path={folder}",
                f"cluster.gpus_per_node={TP}",
                f"parallel.tp={TP}",
                "parallel.cp=1",
                "parallel.pp=1",
                f"training.dtype={dtype}",
            ],
        )
    )


def _proc(path: str, key: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    raise KeyError(key)


def _rank(rank: int, port: int, folder: str, layers: int, dtype: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP, timeout=datetime.timedelta(seconds=900)
    )
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel  # noqa: F401  (imported before the measured window)

    from specdraft.runtime import cpu_compat
    from specdraft.runtime.models.hf import load as hf_load
    from specdraft.runtime.models.hf.checkpoint import plan_checkpoint
    from specdraft.runtime.models.target import build_chunks

    cpu_compat.apply()
    ps.initialize_model_parallel(tensor_model_parallel_size=TP, create_gloo_process_groups=False)
    plan = plan_for(Path(folder), layers, dtype)
    checkpoint = plan_checkpoint(plan)
    counted = []
    original = hf_load.load_chunks
    hf_load.load_chunks = lambda *a: counted.append(original(*a)) or counted[-1]
    param_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    for turn in range(TP):
        dist.barrier()
        if turn != rank:
            continue
        for name in os.listdir(folder):  # cold page cache for this rank's reads (advice; needs no privileges)
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
        rss0, rchar0, start = _proc("/proc/self/status", "VmRSS:") << 10, _proc("/proc/self/io", "rchar:"), time.time()
        chunks = build_chunks(plan, 0, torch.device("cpu"), param_dtype, 0, checkpoint=checkpoint)
        seconds = time.time() - start
        rchar = _proc("/proc/self/io", "rchar:") - rchar0
        peak = (_proc("/proc/self/status", "VmHWM:") << 10) - rss0
        params = sum(p.numel() * p.element_size() for c in chunks for p in c.parameters())
        record = dict(rank=rank, params=params, rchar=rchar, requested=counted[-1], peak=peak, seconds=seconds)
        Path(out, f"rank-{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="the parameters' dtype")
    parser.add_argument("--keep", type=Path, default=None, help="write (or reuse) the checkpoint here")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="hf-import-") as tmp:
        folder = args.keep or Path(tmp) / "ckpt"
        if not (folder / "config.json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            start = time.time()
            n = write_checkpoint(folder, args.layers)
            print(f"checkpoint: {n / 1e9:.3f}B parameters (bf16) in {folder} ({time.time() - start:.0f} s)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_rank, args=(r, port, str(folder), args.layers, args.dtype, tmp)) for r in range(TP)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        rows = [json.loads(Path(tmp, f"rank-{r}.json").read_text()) for r in range(TP)]
    print(f"tp{TP}, {args.dtype} parameters from a bf16 checkpoint; ratios against each rank's own parameter bytes")
    print(f"{'rank':>4} {'params MB':>10} {'rchar/params':>13} {'requested/params':>17} {'peak/params':>12} {'s':>6}")
    for r in rows:
        p = r["params"]
        print(
            f"{r['rank']:>4} {p / 1e6:>10.1f} {r['rchar'] / p:>13.3f} {r['requested'] / p:>17.3f} "
            f"{r['peak'] / p:>12.3f} {r['seconds']:>6.1f}"
        )
    print("targets: bytes read <= 1.1x, peak memory <= 1.5x the rank's parameter bytes")


if __name__ == "__main__":
    main()
