"""Render: a LaunchPlan turned into text (Megatron argv, sbatch, NeMo-RL, vLLM). Imports no torch."""
