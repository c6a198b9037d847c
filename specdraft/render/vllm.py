"""vLLM engine settings for rollout, kept as plain data and validated by a small schema of our own.

`specdraft render --to vllm --check` has vLLM itself validate them (runtime/serve/vllm_check.py, in a subprocess:
only the runtime imports vllm).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from specdraft.plan.model import LaunchPlan, VllmRender
from specdraft.render.paths import draft_model, model_path


@dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """vLLM's speculative_config for an EAGLE-3 draft."""

    method: str
    model: str
    num_speculative_tokens: int
    draft_tensor_parallel_size: int
    num_speculative_tokens_per_batch_size: Optional[tuple[tuple[int, int, int], ...]] = None
    """rollout.adaptive_k: (first batch, last batch, k) ranges, k 0 = no speculation; absent otherwise."""


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """The subset of vLLM EngineArgs specdraft sets."""

    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    dtype: str
    speculative_config: Optional[SpeculativeConfig]

    def problems(self) -> list[str]:
        """Schema rules vLLM itself would enforce at engine start."""
        out = []
        if self.tensor_parallel_size < 1:
            out.append(f"tensor_parallel_size = {self.tensor_parallel_size}: must be >= 1")
        if self.pipeline_parallel_size < 1:
            out.append(f"pipeline_parallel_size = {self.pipeline_parallel_size}: must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            out.append(f"gpu_memory_utilization = {self.gpu_memory_utilization}: must be in (0, 1]")
        if self.max_model_len < 1:
            out.append(f"max_model_len = {self.max_model_len}: must be >= 1")
        if self.max_num_seqs < 1:
            out.append(f"max_num_seqs = {self.max_num_seqs}: must be >= 1")
        if self.dtype not in ("bfloat16", "float16", "float32", "auto"):
            out.append(f"dtype = {self.dtype!r}: must be bfloat16, float16, float32 or auto")
        sc = self.speculative_config
        if sc is not None:
            if sc.method not in ("eagle3", "eagle"):
                out.append(f"speculative_config.method = {sc.method!r}: specdraft renders eagle3")
            if sc.num_speculative_tokens < 1:
                out.append(f"speculative_config.num_speculative_tokens = {sc.num_speculative_tokens}: must be >= 1")
            if sc.draft_tensor_parallel_size not in (1, self.tensor_parallel_size):
                out.append(
                    f"speculative_config.draft_tensor_parallel_size = {sc.draft_tensor_parallel_size}: vLLM "
                    f"supports 1 or the target's tensor_parallel_size ({self.tensor_parallel_size})"
                )
            if not sc.model:
                out.append("speculative_config.model: must name the draft checkpoint")
        return out

    def to_dict(self) -> dict:
        out = asdict(self)
        sc = out["speculative_config"]
        if sc is not None:
            if sc["num_speculative_tokens_per_batch_size"] is None:
                del sc["num_speculative_tokens_per_batch_size"]  # vLLM's default: k at every batch
            else:
                sc["num_speculative_tokens_per_batch_size"] = [
                    list(r) for r in sc["num_speculative_tokens_per_batch_size"]
                ]
        return out


_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}  # fp8: bf16 weights


def engine_settings(plan: LaunchPlan) -> EngineSettings:
    r, d, dtype = plan.rollout_settings, plan.draft, plan.training.dtype
    spec_cfg = None
    if d.enabled and r.speculative:
        spec_cfg = SpeculativeConfig(
            method="eagle3",
            model=draft_model(plan),
            num_speculative_tokens=r.num_speculative_tokens,
            draft_tensor_parallel_size=r.tp,
            num_speculative_tokens_per_batch_size=(
                plan.rollout.adaptive_k.schedule if plan.rollout and plan.rollout.adaptive_k else None
            ),
        )
    return EngineSettings(
        model=model_path(plan),
        tensor_parallel_size=r.tp,
        pipeline_parallel_size=1,
        gpu_memory_utilization=r.gpu_memory_utilization,
        max_model_len=r.max_model_len,
        max_num_seqs=r.max_num_seqs,
        # A CPU plan serves in float32: the CPU runs train in fp32 and the built-in engine decodes in fp32, so a
        # refit vLLM instance's greedy tokens can equal theirs (bf16 would round every weight and logit).
        dtype="float32" if plan.cluster.gpu == "cpu" else _DTYPE[dtype] if dtype != "fp32" else "bfloat16",
        speculative_config=spec_cfg,
    )


def vllm_settings(plan: LaunchPlan) -> VllmRender:
    """The plan's `renders.vllm`: engine arguments shared by every rollout instance."""
    settings = engine_settings(plan)
    r = plan.rollout_settings
    return VllmRender(
        engine_args=settings.to_dict(),
        num_instances=r.num_gpus // max(r.tp, 1),
        problems=tuple(settings.problems()),
    )
