"""One rollout engine per planned rollout instance, and the refit of every instance without a host funnel.

open_instances is collective: every rank learns the instances from the plan (layout.py); each rank lays out what it
sends to the instances its replica feeds (sending.py); the layouts are exchanged once; each instance's lead rank
opens the instance's engine (kind grpo.engine, the plan's settings) from config-only folders, on placeholder
weights; the refit groups are joined (links.py); and a first refit loads the trainer's weights before anything is
generated. A refit is then collective too: each sending rank packs and sends its buckets, each instance's engine
assembles and loads them, and each lead times its instance, the transfer included.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist

from specdraft.runtime.rl.instances.buckets import bucket_bound
from specdraft.runtime.rl.instances.layout import Instance, instance_layout
from specdraft.runtime.rl.instances.links import PairGroup, Rendezvous, WorldLink, host_store, received
from specdraft.runtime.rl.instances.sending import Outgoing

WHICH = ("policy", "draft")


def open_instances(ctx, trainer, *, eos_id: int | None, resumed_engine_draft: dict | None = None) -> "Instances":
    """Every rank: open the plan's rollout instances and load the trainer's current weights into them.
    ``resumed_engine_draft`` (the draft, in its runtime names, the interrupted engines held: a checkpoint's
    engine_draft) starts the engines with that older draft instead of the trainer's; every rank may pass it, the
    draft's sending ranks use it."""
    return Instances(ctx, trainer, eos_id, resumed_engine_draft)


def _all_gather(value: Any) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _raise_any(own: Exception | None, what: str) -> None:
    """Every rank raises when any rank failed ``what`` (so none is left waiting in a collective): a failed rank
    its own exception (a user's error keeps its message and exit code), the others one naming that rank."""
    reports = _all_gather(None if own is None else f"{type(own).__name__}: {own}")
    failed = [(rank, e) for rank, e in enumerate(reports) if e is not None]
    if own is not None:
        raise own
    if failed:
        rank, error = failed[0]
        raise RuntimeError(f"rank {rank} failed to {what} ({len(failed)} ranks failed):\n{error}")


class Instances:
    def __init__(self, ctx, trainer, eos_id: int | None, resumed_draft: dict | None):
        plan = ctx.plan
        self.ctx, self.trainer, self.plan = ctx, trainer, plan
        self.rank = ctx.global_rank
        self.kind = plan.grpo.engine
        self.layout: tuple[Instance, ...] = instance_layout(plan)
        self.speculating = bool(plan.draft.enabled and plan.rollout_settings.speculative)
        self.cuda = ctx.device.startswith("cuda")
        self.out = Outgoing(trainer, self.layout, bucket_bound(), self.speculating, resumed_draft)
        self.out.gather_draft()
        # what this rank sends, then everyone's: (instance, sender) -> {"policy": buckets, "draft": buckets}
        self.store = None
        rendezvous: dict[int, Rendezvous] = {}
        mine = sorted(set(self.out.instances("policy")) | set(self.out.instances("draft")))
        if self.kind == "vllm" and mine:
            self.store, host, port = host_store()
            for i in mine:
                inst = self.layout[i]
                rendezvous[i] = Rendezvous(host, port, i, 1 + len(inst.ranks), self._backend(inst))
        offers = {i: ({w: self.out.buckets(w, i)[0] for w in WHICH}, rendezvous.get(i)) for i in mine}
        self.feeds: dict[int, list[tuple[int, dict, Rendezvous | None]]] = {inst.index: [] for inst in self.layout}
        for sender, offered in enumerate(_all_gather(offers)):
            for i, (buckets, rv) in offered.items():
                self.feeds[i].append((sender, buckets, rv))
        holders = [s for s, buckets, _ in self.feeds[0] if buckets["draft"]] if self.layout else []
        self.draft_holder = holders[0] if holders else None
        self.mine = next((inst for inst in self.layout if inst.lead == self.rank), None)
        self.engine: Any = None
        self._write_folders()
        self._open_engine(eos_id)
        self.links: dict[tuple[int, int], Any] = {}  # (instance, sender) -> PairGroup or WorldLink
        self._connect()
        self._reserve()
        self.refit_policy()
        if self.speculating:
            self._refit("draft", gathered=True)

    # ------------------------------------------------------------------------------------------------ layout
    def lead_of(self, rank: int) -> int:
        """The lead rank of the instance ``rank`` belongs to."""
        return next(inst.lead for inst in self.layout if rank in inst.ranks)

    @property
    def instance_of_this_rank(self) -> Instance | None:
        """The instance this rank leads (whose engine it owns), or None."""
        return self.mine

    def _backend(self, inst: Instance) -> str:
        """gloo on CPU; NCCL on CUDA, unless this sender shares a GPU with the instance (NCCL refuses one device
        twice in a communicator): then gloo through host memory."""
        if not self.cuda:
            return "gloo"
        shares = inst.node == self.ctx.node and self.ctx.local_rank in inst.local_gpus
        return "gloo" if shares else "nccl"

    # ------------------------------------------------------------------------------------------------ opening
    def _write_folders(self) -> None:
        """Rank 0: the config-only HF and EAGLE-3 folders every engine starts from (RUN_DIR/rl/policy, rl/draft)."""
        from specdraft.runtime.folders import write_folder, write_text
        from specdraft.runtime.models.hf import export as hf_export
        from specdraft.runtime.serve import eagle3

        paths = self.ctx.paths
        error: Exception | None = None
        if self.rank == 0:
            try:
                paths.real_dir("rl")
                record = {"source": "grpo", "run": self.plan.run_name, "spec_sha256": self.plan.spec_sha256}
                policy = hf_export.policy_config(self.plan, hf_export.export_dtype(self.plan))
                folders = [(paths.rl_policy, policy, "huggingface")]
                if self.speculating:
                    draft = eagle3.config(self.plan, self.trainer.dtype)
                    hf_export.check_pair(policy, draft)
                    folders.append((paths.rl_draft, draft, "eagle3"))
                for folder, config, form in folders:
                    text = json.dumps(config, indent=2) + "\n"
                    fill = lambda tmp, text=text: write_text(tmp / "config.json", text)
                    write_folder(folder, fill, {**record, "format": form})
            except Exception as err:  # reported on every rank below, so none waits for the folders
                error = err
        _raise_any(error, "write the engines' config-only folders")

    def _open_engine(self, eos_id: int | None) -> None:
        from specdraft.runtime.rl.engine import open_engine

        error: Exception | None = None
        if self.mine is not None:
            rs, paths = self.plan.rollout_settings, self.ctx.paths
            try:
                self.engine = open_engine(
                    self.kind, policy_dir=paths.rl_policy, draft_dir=paths.rl_draft if self.speculating else None,
                    k=rs.num_speculative_tokens, eos_id=eos_id, device=self.ctx.device, seed=self.plan.training.seed,
                    vllm_args=self.plan.renders.vllm.engine_args, local_gpus=self.mine.local_gpus,
                    slots_per_node=self.plan.cluster.gpus_per_node, colocated=rs.colocated,
                )  # fmt: skip
            except Exception as err:  # reported on every rank below, so no rank waits for this engine
                error = err
        _raise_any(error, "open its rollout engine")

    def _connect(self) -> None:
        """The vLLM engines' workers and the senders join one group per (instance, sender), in one global order
        (instance, then sender) on both sides, so no rendezvous waits on one that waits on it."""
        if self.kind != "vllm":
            for i, feeds in self.feeds.items():
                lead = self.layout[i].lead
                for sender, _, _ in feeds:
                    if self.rank in (sender, lead) and sender != lead:
                        self.links[i, sender] = WorldLink(sender, lead, self.rank)
            return
        if self.mine is not None:
            plan = [(rv, buckets) for _, buckets, rv in self.feeds[self.mine.index]]
            self.engine.begin("connect", plan)
        error: Exception | None = None
        try:
            for i in sorted(set(self.out.instances("policy")) | set(self.out.instances("draft"))):
                rv = next(rv for s, _, rv in self.feeds[i] if s == self.rank and rv is not None)
                self.links[i, self.rank] = PairGroup(rv, 0, self.trainer.device, store=self.store)
            if self.mine is not None:
                self.engine.end("connect")
        except Exception as err:  # reported on every rank below
            error = err
        _raise_any(error, "join the refit groups")

    def _reserve(self) -> None:
        """Each sending rank's bucket buffer, once, at its largest bucket (per device: gloo or NCCL)."""
        largest: dict[torch.device, int] = {}
        for which in WHICH:
            for i in self.out.instances(which):
                device = self._link_device(i)
                for bucket in self.out.buckets(which, i)[0]:
                    largest[device] = max(largest.get(device, 0), bucket.nbytes)
        for device, nbytes in largest.items():
            self.out.reserve(device, nbytes)

    def _link_device(self, instance: int) -> torch.device:
        link = self.links.get((instance, self.rank))
        return link.device if isinstance(link, PairGroup) else self.trainer.device

    # ------------------------------------------------------------------------------------------------ refits
    def refit_policy(self) -> dict[int, float]:
        """Every rank: the trainer's policy into every instance; per instance, the seconds its lead measured from
        the call to its engine's reload finishing (the transfer included)."""
        return self._refit("policy")

    def refit_draft(self) -> dict[int, float]:
        """Every rank: the trainer's draft into every instance (a no-op returning zeros without speculation); the
        GRPO loop calls it at the draft's own cadence."""
        if not self.speculating:
            return {inst.index: 0.0 for inst in self.layout}
        return self._refit("draft")

    def _refit(self, which: str, gathered: bool = False) -> dict[int, float]:
        started = time.perf_counter()
        if which == "draft" and not gathered:
            self.out.gather_draft()
        seconds: dict[int, float] = {}
        if self.kind == "vllm":
            if self.mine is not None:
                self.engine.begin("receive", which)
            for i in self.out.instances(which):
                group = self.links[i, self.rank]
                for bucket, source in zip(*self.out.buckets(which, i)):
                    group.broadcast(self.out.pack(group.device, bucket, source))
            if self.mine is not None:
                self.engine.end("receive")
                seconds[self.mine.index] = time.perf_counter() - started
        else:
            for inst in self.layout:  # one global order: instance, then sender
                if inst.lead == self.rank:
                    self._load_builtin(inst, which)
                    seconds[inst.index] = time.perf_counter() - started
                elif inst.index in self.out.instances(which):
                    link = self.links[inst.index, self.rank]
                    for bucket, source in zip(*self.out.buckets(which, inst.index)):
                        link.send(self.out.pack(self.trainer.device, bucket, source))
        merged: dict[int, float] = {}
        for part in _all_gather(seconds):
            merged.update(part)
        return dict(sorted(merged.items()))

    def _load_builtin(self, inst: Instance, which: str) -> None:
        """The lead of a built-in engine: its senders' buckets (its own packed in place) into the engine."""
        own = iter(zip(*self.out.buckets(which, inst.index)))

        def local(bucket):
            mine, source = next(own)
            return self.out.pack(self.trainer.device, mine, source)

        links = [
            (None if sender == self.rank else self.links[inst.index, sender], buckets[which])
            for sender, buckets, _ in self.feeds[inst.index]
        ]
        weights = received(links, self.trainer.device, local=local)
        if which == "policy":
            self.engine.refit_policy(weights)
        else:
            self.engine.refit_draft(weights)

    # ------------------------------------------------------------------------------------------------ draft copy
    def held_draft(self) -> dict[str, torch.Tensor] | None:
        """Every rank: on global rank 0, the draft (runtime names) the engines hold now, as its sending rank kept
        it at the last draft refit; None elsewhere or without a draft. A checkpoint saved between two draft refits
        stores it, so that a resume starts the engines with it (open_instances' resumed_engine_draft)."""
        holder = self.draft_holder
        if holder is None:
            return None
        if holder == 0:
            return self.out.held if self.rank == 0 else None
        from specdraft.runtime.rl import flat

        device = self.trainer.device
        if self.rank == holder:
            held = self.out.held or {}
            dist.send_object_list([[(k, tuple(v.shape), v.dtype) for k, v in held.items()]], dst=0)
            dist.send(flat.pack(list(held.values()), device), dst=0)
        elif self.rank == 0:
            box: list = [None]
            dist.recv_object_list(box, src=holder)
            specs = [(shape, dtype) for _, shape, dtype in box[0]]
            buffer = torch.empty(flat.num_bytes(specs), dtype=torch.uint8, device=device)
            dist.recv(buffer, src=holder)
            views = flat.views(buffer.cpu(), specs)
            return {name: view.clone() for (name, _, _), view in zip(box[0], views)}
        return None

    def close(self) -> None:
        """Every rank: the engines end (each lead closes its own); the refit groups go with this object."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.links.clear()
        self.store = None
