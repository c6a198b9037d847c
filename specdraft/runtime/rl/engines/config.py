"""EngineConfig: what opens one rollout engine (rl/engine.py's factory hands it to the kind's constructor)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What opens one rollout engine: the folders it serves, and where and how it runs."""

    policy_dir: Path
    """A HF folder. Its config.json alone starts the engine on placeholder weights, which the first refit replaces."""
    draft_dir: Optional[Path]
    """An EAGLE-3 folder (the same rule), or None: no speculation."""
    k: int
    """Draft tokens per verify step."""
    eos_id: Optional[int]
    device: str
    """The lead rank's device: "cpu" or "cuda:<local rank>"."""
    seed: int
    vllm_args: Optional[dict] = None
    """vLLM's engine arguments as the plan renders them (plan.renders.vllm.engine_args); None: one device's
    defaults (tests that open an engine by hand)."""
    local_gpus: Optional[tuple[int, ...]] = None
    """The instance's devices on its node (plan.rollout): the GPUs its engine sees on CUDA, its core slots on CPU;
    None: the lead's own device alone."""
    slots_per_node: int = 1
    """cluster.gpus_per_node: the slots a node's cores are split into on CPU (engines/vllm.py cpu_binding)."""
    colocated: bool = True
    """The engine shares its devices with training ranks (vLLM's sleep mode on CUDA)."""

    @property
    def devices(self) -> tuple[int, ...]:
        """The instance's local devices (local_gpus, else the lead's own)."""
        if self.local_gpus is not None:
            return tuple(self.local_gpus)
        return (int(self.device.split(":", 1)[1]),) if self.device.startswith("cuda:") else (0,)
