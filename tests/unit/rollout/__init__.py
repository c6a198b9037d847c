"""Tests of specdraft.rollout."""
