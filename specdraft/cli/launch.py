"""Launch, run listing, status, logs and cancel commands (filled by the launch issue)."""


def register(app) -> None:
    """Add the launch commands to ``app``."""
