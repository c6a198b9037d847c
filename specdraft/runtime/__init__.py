"""Runtime: the job payload that runs on every rank; torch.distributed and megatron-core, reads plan.json."""
