"""Tests against the real local Slurm cluster (the `slurm` marker)."""
