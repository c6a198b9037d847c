"""The workloads `runtime.entry` runs on every rank (`--workload NAME`)."""
