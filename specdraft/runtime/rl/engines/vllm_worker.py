"""The refit's receiving side inside vLLM: a worker extension (vLLM's `worker_extension_cls`), so that it runs in
every tensor-parallel worker, in whichever process vLLM starts that worker. A worker joins one group per sending
trainer rank (rl/instances/links.py), then on each refit receives its senders' buckets, assembles whole HF tensors
and feeds each to vLLM's in-place layerwise reload (model_loader/reload/inplace.py) as soon as it is complete; every
worker receives every byte, and vLLM's weight loaders keep the worker's tensor-parallel share.

Importing this module (vLLM does, in each worker, before it builds the model) also declares that an EAGLE-3 draft
has its own lm_head; see _own_lm_head."""

from __future__ import annotations

import copy
from typing import Any


def _own_lm_head() -> None:
    """specdraft's EAGLE-3 drafts always carry their own lm_head (serve/eagle3.tensors). vLLM decides at load whether
    the draft shares the target's: it learns the draft has a head of its own from the tensor names it loads
    (models/utils.process_eagle_weight), and even then shares a head equal to the target's. An engine started on
    placeholder weights (load_format dummy) loads no names, and vLLM draws every placeholder weight from one seed,
    so a draft head of the target's shape equals the target's: shared, a draft refit would write into the target's
    head. So the class says it has its own head, and its placeholder head is zeros, unlike the target's."""
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    if getattr(Eagle3LlamaForCausalLM, "_specdraft_own_head", False):
        return
    build = Eagle3LlamaForCausalLM.__init__

    def __init__(self, *, vllm_config, prefix: str = ""):  # vLLM passes these two by name, read off the signature
        build(self, vllm_config=vllm_config, prefix=prefix)
        self.lm_head.weight.dummy_weight_value = 0.0  # read by vLLM's dummy loader (initialize_single_dummy_weight)

    Eagle3LlamaForCausalLM.__init__ = __init__  # type: ignore[method-assign]
    Eagle3LlamaForCausalLM.has_own_lm_head = True  # type: ignore[attr-defined]  # SupportsEagleBase's flag
    Eagle3LlamaForCausalLM._specdraft_own_head = True  # type: ignore[attr-defined]


_own_lm_head()


class RefitWorker:
    """Mixed into vLLM's worker class; called through `LLM.collective_rpc`."""

    specdraft_links: list[tuple[Any, dict]]

    def specdraft_join(self, links: list) -> None:
        """Join each sender's group, in the senders' order: ``links`` holds one (Rendezvous, {"policy": buckets,
        "draft": buckets}) per sending trainer rank."""
        from vllm.distributed import get_tensor_model_parallel_rank

        from specdraft.runtime.rl.instances.links import PairGroup

        rank = 1 + get_tensor_model_parallel_rank()  # rank 0 of every pair is its sender
        device = self.model_runner.device  # type: ignore[attr-defined]
        self.specdraft_links = [(PairGroup(rv, rank, device), buckets) for rv, buckets in links]

    def specdraft_receive(self, which: str) -> int:
        """Receive and reload the policy ("policy") or the draft ("draft"); returns the bytes received."""
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        from specdraft.runtime.rl.instances.links import received

        runner = self.model_runner  # type: ignore[attr-defined]
        config = runner.vllm_config
        if which == "draft":  # the drafter loads under its own model config (its architecture, its dtype)
            config = copy.copy(config)
            config.model_config = runner.vllm_config.speculative_config.draft_model_config
            model = runner.drafter.model
        else:
            model = runner.get_model()
        links = [(group, buckets[which]) for group, buckets in self.specdraft_links]
        weights = received(links, runner.device)
        reload_weights(config, model, weights_iterator=weights, weights_path=None, is_checkpoint_format=True)
        return sum(b.nbytes for _, buckets in links for b in buckets)
