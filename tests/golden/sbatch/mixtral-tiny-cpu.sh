#!/bin/bash
# Rendered by specdraft 0.1.0 from layout mixtral-tiny-cpu; nothing in it depends on the clock.
#   spec sha256 <spec-sha256>
#   plan sha256 <plan-sha256>
#   run folder  /scratch/runs/mixtral-tiny-cpu
#
# Submit it with specdraft, which records the job in run.json and refuses to submit this plan twice:
#   specdraft launch /scratch/runs/mixtral-tiny-cpu/plan.json --run-dir /scratch/runs/mixtral-tiny-cpu
# By hand, each task runs the payload directly (submitit's per-task result files are then not written):
#   sbatch /scratch/runs/mixtral-tiny-cpu/sbatch.sh direct
#
#SBATCH --job-name=mixtral-tiny-cpu-<plan8>
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --chdir=/scratch/runs/mixtral-tiny-cpu
#SBATCH --output=/scratch/runs/mixtral-tiny-cpu/submitit/%j_0_log.out
#SBATCH --error=/scratch/runs/mixtral-tiny-cpu/submitit/%j_0_log.err
#SBATCH --open-mode=append
#SBATCH --signal=USR2@60

# Rendezvous for torch.distributed: rank 0 runs on the allocation's first node, and the port is a pure
# function of the job id, so every task agrees on it without talking to the others.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 40000 ))
export MASTER_ADDR MASTER_PORT
# One torch thread per CPU Slurm gives a task; unset, each task starts one per core of the node and they thrash.
export OMP_NUM_THREADS=1
# submitit reads this to know its tasks run under Slurm.
export SUBMITIT_EXECUTOR=slurm

# 8 tasks; every one runs: /opt/venv/bin/python -u -m specdraft.runtime.entry /scratch/runs/mixtral-tiny-cpu/plan.json --workload cotrain
if [[ "${1:-}" == direct ]]; then
    srun --unbuffered --kill-on-bad-exit=1 --output=/scratch/runs/mixtral-tiny-cpu/submitit/%j_%t_log.out --error=/scratch/runs/mixtral-tiny-cpu/submitit/%j_%t_log.err /opt/venv/bin/python -u -m specdraft.runtime.entry /scratch/runs/mixtral-tiny-cpu/plan.json --workload cotrain
else
    srun --unbuffered --kill-on-bad-exit=1 --output=/scratch/runs/mixtral-tiny-cpu/submitit/%j_%t_log.out --error=/scratch/runs/mixtral-tiny-cpu/submitit/%j_%t_log.err /opt/venv/bin/python -u -m submitit.core._submit /scratch/runs/mixtral-tiny-cpu/submitit
fi
