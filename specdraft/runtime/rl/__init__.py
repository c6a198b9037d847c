"""Reinforcement-learning post-training: the rollout engines (engine.py, engines/) and the GRPO pieces."""
