"""Reinforcement learning: the rollout engines, rewards, advantages, the GRPO loss and the prompt stream."""
