"""The Slurm executor: bounded Slurm tools, preflight, submission through submitit."""
