#!/bin/bash
# Rendered by specdraft 0.1.0 from layout grpo-tiny-cpu; nothing in it depends on the clock.
#   spec sha256 <spec-sha256>
#   plan sha256 <plan-sha256>
#   run folder  /scratch/runs/grpo-tiny-cpu
#
# `specdraft launch` writes this script as /scratch/runs/grpo-tiny-cpu/sbatch.sh, beside the plan every task reads
# (/scratch/runs/grpo-tiny-cpu/plan.json), submits it and records the job in run.json (it never submits the same plan twice).
#
#SBATCH --job-name=grpo-tiny-cpu-<plan8>
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --chdir=/scratch/runs/grpo-tiny-cpu
#SBATCH --output=/scratch/runs/grpo-tiny-cpu/submitit/%j_0_log.out
#SBATCH --error=/scratch/runs/grpo-tiny-cpu/submitit/%j_0_log.err
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

# srun runs the payload itself on every task (no per-task wrapper in between), so the USR2 time-limit warning and
# Slurm's SIGTERM reach the runtime: it stops every rank at a step boundary, saves a checkpoint and exits 75; after
# USR2 the job is requeued (at most slurm.max_requeues = 3 times) and the restarted job resumes on its own.
# On the host rank 0 runs `scontrol requeue` itself.
# 4 tasks; every one runs: /opt/venv/bin/python -u -m specdraft.runtime.entry /scratch/runs/grpo-tiny-cpu/plan.json --workload grpo
srun --unbuffered --kill-on-bad-exit=1 --output=/scratch/runs/grpo-tiny-cpu/submitit/%j_%t_log.out --error=/scratch/runs/grpo-tiny-cpu/submitit/%j_%t_log.err /opt/venv/bin/python -u -m specdraft.runtime.entry /scratch/runs/grpo-tiny-cpu/plan.json --workload grpo
