"""Rollout engines behind engine.RolloutEngine: the built-in torch one (fast tests) and vLLM's."""
