"""The built-in rollout engine (runtime/rl/engines/builtin.py) on tiny HF Llama folders and EAGLE-3 draft folders:
greedy rollouts with and without a draft are token-identical; at temperature 1 the tokens at the drafted positions
follow the same law with and without the draft (a two-sample chi-square test that a deliberately wrong acceptance
rule fails); a refit equals a fresh engine with those weights; the counters add up."""

from __future__ import annotations

import pytest
import torch

from specdraft.runtime.rl.engine import open_engine
from specdraft.runtime.rl.engines import sampling
from tests.support import chi_square, rl_models

pytestmark = pytest.mark.dist
K = 3
PROMPTS = [[5, 17, 99, 3], [250, 42, 7, 8, 9, 10], [1, 2]]
VOCAB = rl_models.hf_models.VOCAB


def _open(policy, draft=None, eos_id=None):
    return open_engine("builtin", policy_dir=policy, draft_dir=draft, k=K, eos_id=eos_id, device="cpu", seed=0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny ops: one intra-op thread is many times faster than two on a shared, loaded CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    policy = rl_models.make_policy(root / "policy")
    return {
        "policy": policy,
        "policy2": rl_models.make_policy(root / "policy2", seed=5),
        "draft": rl_models.make_draft(root / "draft", policy, seed=1),
        "draft2": rl_models.make_draft(root / "draft2", policy, seed=2),
        "reduced": rl_models.make_draft(root / "reduced", policy, seed=3, draft_vocab_size=64),
        "constant": rl_models.make_constant_policy(root / "constant"),
    }


def _sane(stats, num_sequences: int) -> None:
    assert 1.0 <= stats.accept_length <= K + 1
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens <= stats.num_draft_tokens <= K * stats.num_drafts
    assert list(stats.accepted_per_pos) == sorted(stats.accepted_per_pos, reverse=True)  # pos i needs pos i-1
    assert num_sequences <= stats.num_target_forwards <= stats.num_generated_tokens
    assert stats.seconds > 0


def test_greedy_rollouts_with_and_without_a_draft_are_token_identical(folders):
    plain, stats = _open(folders["policy"]).generate(
        PROMPTS, num_generations=2, max_new_tokens=16, temperature=0, seed=1
    )
    assert stats.num_target_forwards == stats.num_generated_tokens == 3 * 2 * 16 and stats.num_drafts == 0
    assert [r.prompt_index for r in plain] == [0, 0, 1, 1, 2, 2]
    for name in ("draft", "reduced"):
        got, stats = _open(folders["policy"], folders[name]).generate(
            PROMPTS, num_generations=2, max_new_tokens=16, temperature=0, seed=1
        )
        assert got == plain, name
        _sane(stats, 6)
        assert stats.num_drafts > 0


def test_a_draft_the_target_agrees_with_is_accepted_whole(folders, tmp_path):
    config = rl_models.draft_config(folders["constant"])
    draft = rl_models.write_draft(tmp_path / "zero", config, rl_models.constant_draft(config))
    got, stats = _open(folders["constant"], draft).generate(
        PROMPTS, num_generations=1, max_new_tokens=13, temperature=0, seed=1
    )
    assert all(r.response == (0,) * 13 for r in got)
    assert stats.accept_length == K + 1  # 1 prefill token + 3 verify steps of 4 per sequence
    assert stats.num_target_forwards == 3 * 4 and stats.accepted_per_pos == (9, 9, 9)


def test_a_k_schedule_drafts_by_the_running_batch_and_changes_no_greedy_token(folders, tmp_path):
    """rollout.adaptive_k's engine side: a batch of b drafts the k of the range holding b (vLLM's rule)."""
    plain, _ = _open(folders["policy"]).generate(PROMPTS, num_generations=2, max_new_tokens=16, temperature=0, seed=1)
    engine = _open(folders["policy"], folders["draft"])
    engine.set_k_schedule(((1, 5, 3), (6, 64, 1)))  # 6 sequences run to the end together: k 1 throughout
    got, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=16, temperature=0, seed=1)
    assert got == plain and stats.num_drafts > 0 and stats.num_draft_tokens == stats.num_drafts
    engine.set_k_schedule(((1, 5, 3), (6, 64, 0)))  # speculation off at this batch
    got, stats = engine.generate(PROMPTS, num_generations=2, max_new_tokens=16, temperature=0, seed=1)
    assert got == plain and stats.num_drafts == 0
    config = rl_models.draft_config(folders["constant"])
    agreeing = _open(
        folders["constant"], rl_models.write_draft(tmp_path / "zero", config, rl_models.constant_draft(config))
    )
    agreeing.set_k_schedule(((1, 2, 3), (3, 64, 2)))  # 3 sequences: k 2, every draft accepted
    _, stats = agreeing.generate(PROMPTS, num_generations=1, max_new_tokens=13, temperature=0, seed=1)
    assert stats.num_target_forwards == 3 + 4 * 3 and stats.accepted_per_pos == (12, 12, 0)


def test_eos_ends_a_rollout_and_marks_it_finished(folders):
    plain, _ = _open(folders["policy"]).generate(PROMPTS, num_generations=1, max_new_tokens=16, temperature=0, seed=1)
    eos = plain[0].response[5]
    got, _ = _open(folders["policy"], folders["draft"], eos_id=eos).generate(
        PROMPTS, num_generations=1, max_new_tokens=16, temperature=0, seed=1
    )
    for before, after in zip(plain, got):
        cut = before.response.index(eos) + 1 if eos in before.response else len(before.response)
        assert after.response == before.response[:cut] and after.finished == (eos in before.response)


N = 1200  # samples per arm: the accept-always rule's p-value is then below 1e-12, the exact rule's above 1e-3


def _positions(engine, seed: int) -> torch.Tensor:
    """(N, K + 2) the first K + 2 tokens of N rollouts of one prompt at temperature 1: the prefill's token, K drafted
    positions of the first verify step, and its bonus."""
    got, _ = engine.generate([PROMPTS[0]], num_generations=N, max_new_tokens=K + 2, temperature=1.0, seed=seed)
    return torch.tensor([r.response for r in got])


@pytest.fixture(scope="module")
def plain_samples(folders):
    return _positions(_open(folders["policy"]), seed=11)


def test_sampling_with_the_draft_has_the_targets_law(folders, plain_samples):
    engine = _open(folders["policy"], folders["draft"])
    spec = _positions(engine, seed=12)
    p_values = [chi_square.p_value(plain_samples[:, i], spec[:, i], VOCAB) for i in range(K + 2)]
    assert min(p_values) > 1e-3, p_values


def test_a_wrong_acceptance_rule_is_caught_by_the_same_test(folders, plain_samples, monkeypatch):
    monkeypatch.setattr(sampling, "accept_probability", lambda p_x, q_x: torch.ones_like(p_x))  # accept always
    spec = _positions(_open(folders["policy"], folders["draft"]), seed=12)
    p_values = [
        chi_square.p_value(plain_samples[:, i], spec[:, i], VOCAB) for i in range(1, K + 1)
    ]  # the drafted positions
    assert max(p_values) < 1e-6, p_values


def test_a_refit_equals_a_fresh_engine_with_those_weights(folders):
    engine = _open(folders["policy"], folders["draft"])
    seconds = engine.refit_policy(rl_models.policy_tensors(folders["policy2"]).items())
    seconds += engine.refit_draft(rl_models.policy_tensors(folders["draft2"]).items())
    assert seconds > 0
    fresh = _open(folders["policy2"], folders["draft2"])
    for temperature in (0.0, 1.0):  # sampled rollouts depend on the draft's q: equal under one seed
        a = engine.generate(PROMPTS, num_generations=3, max_new_tokens=12, temperature=temperature, seed=4)
        b = fresh.generate(PROMPTS, num_generations=3, max_new_tokens=12, temperature=temperature, seed=4)
        assert a[0] == b[0]
        assert a[1].accepted_per_pos == b[1].accepted_per_pos
    with pytest.raises(ValueError, match="no place"):
        engine.refit_draft([("midlayer.nope.weight", torch.zeros(1))])


def test_a_refit_with_checkpoint_names_transformers_converts_equals_a_fresh_engine(tmp_path):
    """transformers 5 fuses Mixtral's per-expert checkpoint tensors: the refit goes through its loader."""
    fields = dict(hidden_size=128, num_attention_heads=4)
    first = rl_models.hf_models.make("mixtral", tmp_path / "a", seed=0, **fields)
    second = rl_models.hf_models.make("mixtral", tmp_path / "b", seed=3, **fields)
    engine = _open(first)
    engine.refit_policy(rl_models.policy_tensors(second).items())
    a = engine.generate(PROMPTS, num_generations=1, max_new_tokens=10, temperature=0, seed=0)
    b = _open(second).generate(PROMPTS, num_generations=1, max_new_tokens=10, temperature=0, seed=0)
    assert a[0] == b[0]


def test_a_prompts_samples_depend_on_its_seed_alone(folders):
    """Sampled through the draft, a prompt given the same seed draws the same tokens whatever else shares its batch
    and whatever the batch's longest budget: what keeps a GRPO step's samples the same on any instance."""
    engine = _open(folders["policy"], folders["draft"])
    together, _ = engine.generate(PROMPTS, num_generations=3, max_new_tokens=9, temperature=1.0, seed=[70, 80, 90])
    alone, _ = engine.generate([PROMPTS[1]], num_generations=3, max_new_tokens=9, temperature=1.0, seed=[80])
    assert [r.response for r in together if r.prompt_index == 1] == [r.response for r in alone]
    other, _ = engine.generate([PROMPTS[1]], num_generations=3, max_new_tokens=9, temperature=1.0, seed=[81])
    assert [r.response for r in other] != [r.response for r in alone]
