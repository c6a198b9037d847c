"""Rollout: vLLM instance planning, the length-aware scheduler and the rollout simulator. Pure Python."""
