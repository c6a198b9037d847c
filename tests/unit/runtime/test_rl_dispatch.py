"""The dispatch of a GRPO step's prompt groups to the rollout instances (runtime/rl/dispatch.py): fifo deals stream
positions round-robin across steps; asp places the longest predicted first on the least-loaded instance, with
predictions from each prompt's measured lengths in earlier epochs; every group stays whole on one instance."""

from __future__ import annotations

from types import SimpleNamespace

from specdraft.runtime.rl.dispatch import LengthPredictor, dispatch


def _prompts(keys, first=0):
    return [SimpleNamespace(key=k, index=first + i, tokens=(1, 2, 3)) for i, k in enumerate(keys)]


def _dispatch(policy, prompts, predictor, n=2):
    return dispatch(policy, prompts, predictor, num_instances=n, num_generations=4, global_batch_size=16,
                    first_position=prompts[0].index)  # fmt: skip


def test_fifo_deals_stream_positions_round_robin_across_steps():
    predictor = LengthPredictor(max_new_tokens=8)
    d = _dispatch("fifo", _prompts(range(6), first=0), predictor, n=4)
    assert d.queues == ((0, 4), (1, 5), (2,), (3,))
    d = _dispatch("fifo", _prompts(range(6), first=6), predictor, n=4)  # position 6 -> instance 2
    assert d.instance_of() == [2, 3, 0, 1, 2, 3]


def test_asp_places_the_longest_predicted_first_on_the_least_loaded_instance():
    predictor = LengthPredictor(max_new_tokens=100)
    predictor.observe([10, 11, 12, 13], [[90] * 4, [10] * 4, [40] * 4, [50] * 4])
    d = _dispatch("asp", _prompts([10, 11, 12, 13]), predictor)
    assert d.predicted == (90.0, 10.0, 40.0, 50.0)
    assert d.queues == ((0, 1), (3, 2))  # 90 + 10 against 50 + 40; each queue longest first
    assert sorted(p for q in d.queues for p in q) == [0, 1, 2, 3]


def test_the_predictor_keeps_a_mean_per_row_and_a_documented_prior():
    predictor = LengthPredictor(max_new_tokens=64)
    assert predictor.predict(7) == 32.0  # before any measurement: half of max_response_length
    predictor.observe([7], [[10, 20]])
    predictor.observe([7, 8], [[30, 40], [4, 4]])
    assert predictor.predict(7) == 25.0 and predictor.predict(8) == 4.0
    assert predictor.predict(9) == (10 + 20 + 30 + 40 + 8) / 6  # never measured: the run's mean so far
    copy = LengthPredictor(max_new_tokens=64)
    copy.load(predictor.state())
    assert copy.state() == predictor.state() and copy.predict(9) == predictor.predict(9)
