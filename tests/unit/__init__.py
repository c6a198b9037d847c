"""One process, no Slurm: the tests `make test-fast` runs, one folder per package."""
