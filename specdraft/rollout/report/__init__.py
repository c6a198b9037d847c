"""What the rollout commands report: comparisons over seeds, metrics, the overview and plots."""
