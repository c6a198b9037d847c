"""The GRPO progress bar's figures (cli/cotrain_view.grpo_info): the issue's per-step list, per-position acceptance
included, and a missing or odd value of metrics.jsonl shown as ?."""

from __future__ import annotations

from specdraft.cli.cotrain_view import grpo_info


def test_the_bar_shows_each_figure_and_the_per_position_acceptance():
    row = {
        "reward_mean": 0.5, "reward_std": 0.1, "response_length": 8.0, "policy_loss": -0.01, "kl": 0.002,
        "clip_fraction": 0.0, "draft_loss": 0.62, "generate_s": 0.08, "refit_s": 0.002, "train_s": 0.3,
        "tokens_per_s": 3261.3, "engine": {"accept_length": 2.12, "acceptance_per_pos": [0.707, 0.253, 0.162]},
    }  # fmt: skip
    assert grpo_info(row) == (
        "reward 0.500±0.100  len 8.0  loss -0.010  kl 0.0020  clip 0.00  draft 0.620  accept_len 2.12 "
        "[0.71 0.25 0.16]  gen 0.1s refit 0.00s train 0.3s 3261 tok/s"
    )


def test_odd_values_show_as_question_marks():
    info = grpo_info({"reward_mean": "high", "engine": {"acceptance_per_pos": "x"}})
    assert info.startswith("reward ?±?") and "accept_len ? [?]" in info
    assert "accept_len ? [?]" in grpo_info({"engine": None})
