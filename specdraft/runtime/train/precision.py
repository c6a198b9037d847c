"""Mixed precision for the runtime's two optimizers: fp32 main (master) weights for bf16/fp16 parameters, gradients
accumulated and reduced in fp32 (bf16 with training.grad_reduce_in_bf16), Megatron's dynamic loss scaling for fp16,
and the distributed optimizer (main weights and AdamW state sharded by whole parameters over data-parallel ranks).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Megatron-LM's dynamic loss scaler (--loss-scale-window 1000, --hysteresis 2, --min-loss-scale 1) starting at
# torch.amp.GradScaler's 2**16 rather than Megatron-LM's 2**32, which skips about 17 steps before it settles.
INITIAL_LOSS_SCALE = 2.0**16
MIN_LOSS_SCALE = 1.0
LOSS_SCALE_WINDOW = 1000
HYSTERESIS = 2
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Policy:
    """How one run keeps its numbers: parameter dtype, gradient dtype for accumulation and reduction, loss scaling."""

    param_dtype: torch.dtype
    reduce_in_bf16: bool  # accumulate and all-reduce grads in bf16 (training.grad_reduce_in_bf16), else fp32
    loss_scaling: bool  # dynamic loss scaling (fp16)

    @classmethod
    def of(cls, training) -> "Policy":
        """From the spec's training section; the same on every device (CPU runs bf16 and fp16 too)."""
        if training.dtype not in _DTYPES:
            raise ValueError(f"training.dtype={training.dtype} has no runtime precision policy here; use bf16")
        dtype = _DTYPES[training.dtype]
        return cls(
            param_dtype=dtype,
            reduce_in_bf16=bool(training.grad_reduce_in_bf16) and dtype == torch.bfloat16,
            loss_scaling=dtype == torch.float16,
        )

    @property
    def main_weights(self) -> bool:
        """fp32 main weights beside the model's parameters (bf16, fp16); fp32 parameters are their own."""
        return self.param_dtype != torch.float32

    def describe(self, sharded_over: int) -> str:
        """One line for metrics.jsonl: what the optimizer step does at this precision."""
        name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.param_dtype]
        parts = [f"{name} params"]
        if self.main_weights:
            parts += ["fp32 main weights", f"grads {'bf16' if self.reduce_in_bf16 else 'fp32'}"]
        parts.append("dynamic loss scale" if self.loss_scaling else "no loss scale")
        parts.append(f"AdamW sharded over {sharded_over} dp x cp ranks" if sharded_over > 1 else "AdamW replicated")
        return "specdraft " + ", ".join(parts)


class LossScaler:
    """Megatron's DynamicGradScaler semantics on the host: a step whose gradients hold an inf or NaN is skipped; after
    `hysteresis` such steps in a row (and on every further one) the scale halves, down to `min_scale`; after
    `window` clean steps it doubles (and the hysteresis count is restored). Scales stay powers of two, so unscaling
    is exact. Every rank updates it with the same world-agreed verdict, so every rank holds the same scale."""

    def __init__(
        self,
        initial: float = INITIAL_LOSS_SCALE,
        min_scale: float = MIN_LOSS_SCALE,
        window: int = LOSS_SCALE_WINDOW,
        hysteresis: int = HYSTERESIS,
    ):
        if not 0 < min_scale <= initial or window < 1 or hysteresis < 1:
            raise ValueError(
                f"loss scaler: need 0 < min_scale <= initial, window >= 1, hysteresis >= 1; got "
                f"{min_scale}, {initial}, {window}, {hysteresis}"
            )
        self.scale, self.min_scale, self.window, self.hysteresis = float(initial), float(min_scale), window, hysteresis
        self.growth_tracker, self.hysteresis_tracker = 0, hysteresis

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """megatron's `config.grad_scale_func`: the schedule multiplies the last stage's loss by it before backward
        (and the MoE load-balancing loss's gradient follows it)."""
        return loss * self.scale

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale / 2, self.min_scale)
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.window:
            self.growth_tracker, self.hysteresis_tracker = 0, self.hysteresis
            self.scale *= 2

    def state(self) -> dict:
        return {
            "scale": self.scale,
            "growth_tracker": self.growth_tracker,
            "hysteresis_tracker": self.hysteresis_tracker,
        }

    def load(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker, self.hysteresis_tracker = int(state["growth_tracker"]), int(state["hysteresis_tracker"])


class GradView:
    """What grads.py reduces, clips and measures for one model parameter: its accumulated gradient in the reduction
    dtype (an fp32 buffer the backward hook adds into, or the parameter's own .grad), with the parameter's tags
    (tensor_model_parallel, sequence_parallel, shared, ...) read through."""

    def __init__(self, param: torch.nn.Parameter, buffer: torch.Tensor | None):
        self.param, self.buffer, self.touched = param, buffer, False

    @property
    def grad(self) -> torch.Tensor | None:
        if self.buffer is None:
            return self.param.grad
        return self.buffer if self.touched else None  # untouched: no gradient this step, as autograd leaves it

    def __getattr__(self, name):  # only for names the view does not have itself: the parameter's tags
        return getattr(self.param, name)

    def zero(self) -> None:
        if self.buffer is not None and self.touched:
            self.buffer.zero_()
        self.touched = False
        self.param.grad = None


def _accumulate_into(view: GradView):
    """Backward hook: add this microbatch's low-precision gradient into the fp32 buffer and free it (what megatron's
    DDP does with main_grad), so gradients summed over microbatches keep fp32 precision."""

    def hook(param: torch.nn.Parameter) -> None:
        view.buffer.add_(param.grad)
        view.touched = True
        param.grad = None

    return hook


def owners(params: list, group_size: int) -> list[int]:
    """The group rank that owns (holds the main weight and AdamW state of) each parameter: largest first onto the
    least-loaded rank, ties to the lowest rank. Deterministic, so every member of the group computes the same map."""
    load = [0] * group_size
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        rank = min(range(group_size), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += params[i].numel()
    return owner


class MainOptimizer:
    """AdamW over fp32 main parameters for one model (the target's chunks or the draft).

    bf16/fp16 parameters get an fp32 main copy; fp32 parameters are their own main copy (and then nothing here
    differs from AdamW on the parameters themselves). With ``shards`` (a list of (parameters, process group)), each
    parameter's main copy and AdamW state live only on its owner in that group (`owners`): the owner steps it and
    broadcasts the new value to the group, so optimizer memory is divided by the group size (ZeRO stage 1)."""

    def __init__(
        self, params: list, *, lr: float, policy: Policy, device: torch.device, shards=None, warmup_steps: int = 0
    ):
        self.params, self.policy = list(params), policy
        self.lr, self.warmup_steps = lr, warmup_steps
        self.views = []
        for p in self.params:
            buffer = None
            if p.dtype != torch.float32 and not policy.reduce_in_bf16:
                buffer = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            view = GradView(p, buffer)
            if buffer is not None:
                p.register_post_accumulate_grad_hook(_accumulate_into(view))
            self.views.append(view)
        self.view_of = {id(p): v for p, v in zip(self.params, self.views)}
        self.broadcasts = []  # (group, [(group rank, global rank, [params it owns])]) after every step
        owned = {id(p) for p in self.params}
        self.sharded_ids: set = set()
        self.sharded_over = 1
        for group_params, group in shards or ():
            size = dist.get_world_size(group) if group is not None else 1
            if size == 1:
                continue
            self.sharded_over = max(self.sharded_over, size)
            me, who = dist.get_rank(group), owners(group_params, size)
            members = [
                (r, dist.get_global_rank(group, r), [p for p, o in zip(group_params, who) if o == r])
                for r in range(size)
            ]
            self.broadcasts.append((group, members))
            self.sharded_ids |= {id(p) for p in group_params}
            owned -= {id(p) for p, o in zip(group_params, who) if o != me}
        self.owned = [p for p in self.params if id(p) in owned]
        # Main weights: fp32 copies of the low-precision parameters this rank owns.
        self.main = [
            p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone()) for p in self.owned
        ]
        # Fused AdamW on CUDA (one kernel over every fp32 main weight); torch's default elsewhere (bit-identical to
        # the runtime's AdamW before mixed precision on CPU/fp32).
        fused = {"fused": True} if device.type == "cuda" else {}
        self.optimizer = torch.optim.AdamW(self.main, lr=lr, **fused) if self.main else None

    def is_sharded(self, param) -> bool:
        """True when ``param``'s main weight and AdamW state live on one owner of its group."""
        return id(param) in self.sharded_ids

    def grad_views(self, params) -> list:
        """The views of ``params`` (model parameters), in order."""
        return [self.view_of[id(p)] for p in params]

    def grads(self) -> list[torch.Tensor]:
        return [v.grad for v in self.views if v.grad is not None]

    def grad_bytes(self) -> int:
        return sum(g.nbytes for g in self.grads())

    def state_bytes(self) -> int:
        """Main weights (when separate) and AdamW state held on this rank."""
        total = sum(m.nbytes for m, p in zip(self.main, self.owned) if m is not p)
        if self.optimizer is not None:
            total += sum(t.nbytes for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t))
        return total

    def unscale(self, inverse: float) -> None:
        grads = self.grads()
        if grads and inverse != 1.0:
            torch._foreach_mul_(grads, inverse)

    def step(self) -> None:
        """AdamW on the owned main weights from the (reduced, unscaled, clipped) grads; copy back; share; clear."""
        for p, m in zip(self.owned, self.main):
            g = self.view_of[id(p)].grad
            if m is not p:
                m.grad = None if g is None else g if g.dtype == torch.float32 else g.float()
        if self.optimizer is not None:
            self._warm_up()
            self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.owned, self.main):
                if m is not p:
                    p.copy_(m)  # round to the parameter's dtype
                    m.grad = None
            self._share()
        self.zero_grad()

    def _warm_up(self) -> None:
        """The rate of the step about to be taken: lr * n / warmup_steps for the n-th step (counted by AdamW's own
        step, which a checkpoint restores), then lr. Adam's first steps move every weight by about the rate, so a
        full-rate start undoes a pretrained model's tuning (measured on imported drafts: docs/models.md)."""
        if not self.warmup_steps or self.optimizer is None:
            return
        state: dict = next(iter(self.optimizer.state.values()), {})
        taken = int(state["step"]) if "step" in state else 0
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * min(1.0, (taken + 1) / self.warmup_steps)

    def zero_grad(self) -> None:
        for view in self.views:
            view.zero()

    def _share(self) -> None:
        """Every owner broadcasts its updated parameters to the group, one flat message per owner and dtype."""
        for group, members in self.broadcasts:
            for _rank, src, params in members:
                by_dtype: dict = {}
                for p in params:
                    by_dtype.setdefault(p.dtype, []).append(p)
                for dtype in sorted(by_dtype, key=str):
                    ps = by_dtype[dtype]
                    if dist.get_rank() == src:
                        flat = torch.cat([p.reshape(-1) for p in ps])
                    else:
                        flat = torch.empty(sum(p.numel() for p in ps), dtype=dtype, device=ps[0].device)
                    dist.broadcast(flat, src=src, group=group)
                    offset = 0
                    for p in ps:
                        p.copy_(flat[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()


def scaled(loss: torch.Tensor, scaler: LossScaler | None) -> torch.Tensor:
    """The loss to call backward on outside megatron's schedule (a draft off the last stage)."""
    return loss if scaler is None else scaler.scale_loss(loss)


NONFINITE_ENV = "SPECDRAFT_NONFINITE_STEPS"  # tests: global rank 0 puts an inf into a target grad at these steps


def optimizer_steps(trainer) -> dict:
    """One optimizer step of both models, the order Megatron's mixed-precision optimizer uses: sum the grads over
    the ranks that share each parameter (grads.py), unscale (fp16), measure the global norms, agree over the world
    whether any grad is inf/NaN, then clip and step both AdamWs, or (fp16) skip both and lower the loss scale.

    Without loss scaling a non-finite gradient stops the run (FloatingPointError on every rank, like Megatron-LM's
    check_for_nan_in_loss_and_grad) rather than writing NaN into the weights. Returns this step's report for
    metrics.jsonl: grad_norm, draft_grad_norm, loss_scale (the scale this step's backward used), skipped.
    """
    from megatron.core import parallel_state as ps

    from specdraft.runtime.train.grads import (
        TargetParams,
        all_reduce_grads,
        clip_grads,
        reduce_target_grads,
        reduce_tied_embedding_grads,
        replicated_grad_norm,
        target_grad_norm,
    )

    target, scaler, device = trainer.optimizer, trainer.loss_scaler, trainer.device
    tp = trainer.target_params
    views = TargetParams(
        tuple(target.grad_views(tp.dense)),
        tuple(target.grad_views(tp.experts)),
        tp.has_experts,
        tuple(target.grad_views(tp.qk_norms)),
    )
    if str(getattr(trainer, "step", -1)) in os.environ.get(NONFINITE_ENV, "").split(",") and dist.get_rank() == 0:
        next(v.grad for v in views.all() if v.grad is not None).view(-1)[0] = float("inf")
    reduce_target_grads(views, trainer.sequence_parallel)
    reduce_tied_embedding_grads(views)
    trainer.grad_bytes = target.grad_bytes()
    draft = trainer.draft_optimizer if trainer.draft is not None and trainer.cotraining else None
    if draft is not None:
        all_reduce_grads(
            [v for v in draft.views if v.grad is not None], ps.get_data_parallel_group(with_context_parallel=True)
        )
    used_scale = scaler.scale if scaler is not None else None
    for opt in (target, draft):
        if opt is not None and scaler is not None:
            opt.unscale(1.0 / scaler.scale)
    norm = target_grad_norm(views, device)
    draft_norm = replicated_grad_norm(draft.views, trainer.tp_group, device) if draft is not None else 0.0
    # Every rank must take the same branch: the draft's norm is known on the draft's ranks only.
    verdict = torch.tensor(
        [
            float(not math.isfinite(norm)),
            float(not math.isfinite(draft_norm)),
            draft_norm if math.isfinite(draft_norm) else 0.0,
        ],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
    bad_target, bad_draft, draft_norm = verdict.tolist()
    cotraining = trainer.cotraining and trainer.draft_enabled
    report = {
        "grad_norm": norm if not bad_target else None,
        "draft_grad_norm": draft_norm if cotraining and not bad_draft else None,
        "loss_scale": used_scale,
        "skipped": False,
    }
    if bad_target or bad_draft:
        if scaler is None:
            raise FloatingPointError(
                f"step {getattr(trainer, 'step', '?')}: the {'target' if bad_target else 'draft'}"
                f"'s gradient norm is not finite ({norm if bad_target else 'inf/nan'}); lower "
                "training.lr (or draft.lr), or train in fp32 to find the first bad value"
            )
        scaler.update(True)
        for opt in (target, draft):
            if opt is not None:
                opt.zero_grad()
        return {**report, "skipped": True}
    if scaler is not None:
        scaler.update(False)
    if trainer.clip > 0:
        clip_grads(views.all(), norm, trainer.clip)
    target.step()
    if draft is not None:
        if trainer.draft_clip > 0:
            clip_grads(draft.views, draft_norm, trainer.draft_clip)
        draft.step()
    return report
