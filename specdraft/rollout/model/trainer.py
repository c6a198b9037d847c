"""Training-side estimate for the rollout simulator: minibatch step time (MFU model), padding, weight sync.

The trainer runs the layout's Megatron parallelism on its GPUs; a GRPO minibatch costs a forward + backward of
the policy, the forward that recomputes the old-policy log-probs, and the co-trained draft's TTT unroll.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.plan.compile import parallel_dims
from specdraft.plan.memory import draft_params
from specdraft.rollout.model.instances import model_params
from specdraft.spec.derived import head_dim
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec

# Model FLOPs utilisation the trainer reaches on useful tokens. An assumption: Megatron-LM's README reports
# 41-48% MFU for dense GPT training on H100 clusters; RL training with variable lengths sits at the low end.
TRAINING_MFU = 0.40
# 6N per token for forward + backward, plus 2N for the forward that recomputes the old-policy log-probs (GRPO).
POLICY_FLOPS_PER_PARAM = 8.0
# Inter-node bandwidth per GPU for weight sync to dedicated rollout nodes: one 400 Gb/s NIC per GPU.
INTER_NODE_BW = 50e9


@dataclass(frozen=True)
class TrainerModel:
    """Minibatch step time from FLOPs, the layout's DP/PP split and the MFU assumption."""

    gpus: int
    dp: int
    pp: int
    microbatches: int
    micro_batch_size: int
    packing: bool
    flops_per_token: float  # dense: 8 N_policy + 6 N_draft * ttt_steps
    attn_flops_coef: float  # times seq_len^2 per sequence (causal attention, fwd + bwd + log-prob forward)
    gpu_flops: float  # one GPU's achieved FLOP/s: peak * MFU
    sync_s: float  # weight sync to the rollout instances after each RL step

    def seq_flops(self, tokens: int) -> float:
        return self.flops_per_token * tokens + self.attn_flops_coef * tokens * tokens

    def pp_factor(self) -> float:
        """1F1B pipeline fill/drain: (m + pp - 1) / m, identical for every rollout policy."""
        return (self.microbatches + self.pp - 1) / self.microbatches

    def minibatch(self, seqs: list[int]) -> tuple[float, float]:
        """(step seconds, padding GPU-seconds) for sequences of ``seqs`` tokens, in minibatch order.

        Megatron splits a global batch over data-parallel ranks by index (contiguous shares), and the step waits
        for the slowest rank. Without packing, every microbatch is also padded to its longest sequence. Both
        are padding: GPU time spent on work that is not a real token.
        """
        if not seqs:
            return 0.0, 0.0
        dp = max(1, min(self.dp, len(seqs)))
        share = -(-len(seqs) // dp)
        padded, useful = [], 0.0
        for r in range(dp):
            part = seqs[r * share : (r + 1) * share]
            useful += sum(self.seq_flops(x) for x in part)
            if self.packing:
                padded.append(sum(self.seq_flops(x) for x in part))
            else:
                mbs = max(1, self.micro_batch_size)
                padded.append(
                    sum(
                        len(part[i : i + mbs]) * self.seq_flops(max(part[i : i + mbs]))
                        for i in range(0, len(part), mbs)
                    )
                )
        gpus_per_rank = self.gpus / self.dp
        slowest = max(padded) / (gpus_per_rank * self.gpu_flops) * self.pp_factor()
        padding_gpu_s = (dp * max(padded) - useful) / self.gpu_flops * self.pp_factor()
        return slowest, padding_gpu_s


def from_spec(spec: LayoutSpec) -> TrainerModel:
    """The trainer of the layout: Megatron's tp x cp x pp x dp on the training GPUs."""
    sizes = parallel_dims(spec)
    m = spec.model
    gpu = CATALOGUE[spec.cluster.gpu]
    width = m.num_attention_heads * head_dim(m)
    n_policy = model_params(spec)
    per_token = POLICY_FLOPS_PER_PARAM * n_policy
    attn = 4.0 * 2.0 * m.num_layers * width  # (fwd+bwd = 3x) + log-prob fwd (1x), each 2*L*w*T^2 causal
    if spec.draft.enabled:
        steps = spec.draft.ttt_steps
        per_token += 6.0 * draft_params(spec) * steps
        attn += 3.0 * 2.0 * spec.draft.num_layers * width * steps
    weight_bytes = 2 * (n_policy + (draft_params(spec) if spec.draft.enabled else 0))
    r = spec.rollout
    if r.colocated:
        sync = weight_bytes / sizes.tp / gpu.link_bw  # in-place reshard inside the node
    else:
        sync = weight_bytes / r.tp / INTER_NODE_BW  # each rollout GPU pulls its shard over the network
    return TrainerModel(
        gpus=sizes.world_size,
        dp=sizes.dp,
        pp=sizes.pp,
        microbatches=sizes.num_microbatches,
        micro_batch_size=sizes.micro_batch_size,
        packing=spec.training.packing,
        flops_per_token=per_token,
        attn_flops_coef=attn,
        gpu_flops=gpu.peak_flops * TRAINING_MFU,
        sync_s=sync,
    )
