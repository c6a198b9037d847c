"""Tests that spawn several torch.distributed processes on gloo (the `dist` marker)."""
