"""Plan: the pure, deterministic compile step from a layout spec to a LaunchPlan. Imports no torch."""
