"""Execute: every side effect of launching a plan (run folders, Slurm via submitit, local processes)."""
