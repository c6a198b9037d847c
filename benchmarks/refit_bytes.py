"""The bytes a GRPO refit sends each rollout instance on the shipped layouts, and the time that implies over one
NVLink (450 GB/s each way) or one InfiniBand NDR link (50 GB/s): the figures of docs/grpo-rollouts.md, from
rollout/model/refit.py (bf16 weights; each instance, and each of its GPUs, receives the whole policy).

    .venv/bin/python benchmarks/refit_bytes.py
"""

from __future__ import annotations

from specdraft.rollout.model.refit import IB_BYTES_S, NVLINK_BYTES_S, refit_traffic
from specdraft.spec.load import load_layout

LAYOUTS = [
    ("llama3.1-8b-pat", "layouts/llama3.1-8b-pat.yaml", []),
    ("llama3.1-8b-pat on 64 GPUs", "layouts/llama3.1-8b-pat.yaml", ["cluster.num_nodes=8"]),
    ("llama3-70b (no rollout section: tp 1)", "layouts/llama3-70b.yaml", []),
    ("llama3-70b, rollout.tp=8", "layouts/llama3-70b.yaml", ["rollout.tp=8"]),
]


def main() -> None:
    columns = [
        "layout", "instances x tp", "replicas (dp)", "instances per replica", "senders per instance",
        "policy per instance (bf16)", "each sender sends", "draft per instance", "NVLink 450 GB/s",
        "InfiniBand 50 GB/s",
    ]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for name, path, overrides in LAYOUTS:
        t = refit_traffic(load_layout(path, overrides))
        draft = f"{t.draft_bytes / 1e9:.2f} GB" if t.draft_bytes else "- (no speculation)"
        print(
            f"| {name} | {t.num_instances} x {t.rollout_tp} | {t.num_replicas} | {t.instances_per_replica} | "
            f"{t.senders_per_instance} | {t.policy_bytes / 1e9:.2f} GB | {t.sender_bytes / 1e9:.2f} GB | {draft} | "
            f"{t.seconds(NVLINK_BYTES_S):.3f} s | {t.seconds(IB_BYTES_S):.2f} s |"
        )


if __name__ == "__main__":
    main()
