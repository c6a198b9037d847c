#!/bin/bash
# Rendered by specdraft 0.1.0 from layout tiny-cpu; nothing in it depends on the clock.
#   spec sha256 <spec-sha256>
#   plan sha256 <plan-sha256>
#   run folder  /scratch/runs/c
#
# `specdraft launch` writes this script as /scratch/runs/c/sbatch.sh, beside the plan every task reads
# (/scratch/runs/c/plan.json), submits it and records the job in run.json (it never submits the same plan twice).
#
#SBATCH --job-name=tiny-cpu-<plan8>
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --mem=200G
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --chdir=/scratch/runs/c
#SBATCH --output=/scratch/runs/c/submitit/%j_0_log.out
#SBATCH --error=/scratch/runs/c/submitit/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --signal=USR2@60
#SBATCH --requeue

# Rendezvous for torch.distributed: rank 0 runs on the allocation's first node, and the port is a pure
# function of the job id, so every task agrees on it without talking to the others.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 40000 ))
export MASTER_ADDR MASTER_PORT
# One torch thread per CPU Slurm gives a task; unset, each task starts one per core of the node and they thrash.
export OMP_NUM_THREADS=1

# Container mode (pyxis): every task runs in nvcr.io#nvidia/nemo-rl:v0.4.0. The run folder is mounted at its own path, so
# plan.json, the checkpoints, the results and the requeue request are where the payload looks for them.
# specdraft gets in by mount (slurm.container_specdraft: mount): the package /opt/specdraft-src/specdraft is mounted read-only at
# its own path and goes first on the payload's sys.path; torch and megatron-core come from the image.

# srun runs the payload itself on every task (no per-task wrapper in between), so the USR2 time-limit warning and
# Slurm's SIGTERM reach the runtime: it stops every rank at a step boundary, saves a checkpoint and exits 75; after
# USR2 the job is requeued (at most slurm.max_requeues = 3 times) and the restarted job resumes on its own.
# The container has no Slurm client: rank 0 leaves a requeue request in the run folder and this script, outside
# the container, runs `scontrol requeue` once srun returns.
# 4 tasks; every one runs: python -u -c 'import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module("specdraft.runtime.entry", run_name="__main__", alter_sys=True)' /opt/specdraft-src /scratch/runs/c/plan.json --workload cotrain
srun --unbuffered --kill-on-bad-exit=1 --output=/scratch/runs/c/submitit/%j_%t_log.out --error=/scratch/runs/c/submitit/%j_%t_log.err '--container-image=nvcr.io#nvidia/nemo-rl:v0.4.0' --container-mounts=/lustre/data:/data:ro,/scratch/runs/c:/scratch/runs/c,/opt/specdraft-src/specdraft:/opt/specdraft-src/specdraft:ro python -u -c 'import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module("specdraft.runtime.entry", run_name="__main__", alter_sys=True)' /opt/specdraft-src /scratch/runs/c/plan.json --workload cotrain
status=$?
# The request names this job and this attempt ("<job id> <restart count>"), so an old one never requeues it.
request=/scratch/runs/c/requeue-request
if [[ -f "$request" && "$(head -c 64 -- "$request")" == "$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0}" ]]; then
  rm -f -- "$request"
  echo "[specdraft] requeueing job $SLURM_JOB_ID, as rank 0 asked after its checkpoint"
  timeout 30 scontrol requeue "$SLURM_JOB_ID" || echo "[specdraft] scontrol requeue $SLURM_JOB_ID failed (exit $?); \
the run stopped at its checkpoint: specdraft launch --resume continues it" >&2
fi
exit "$status"
