"""Rollout commands: plan, simulate, profile (filled by the rollout issue)."""


def register(app) -> None:
    """Add the rollout sub-app to ``app``."""
