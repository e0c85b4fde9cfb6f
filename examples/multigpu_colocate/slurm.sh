#!/bin/bash
# The multi-GPU example on several nodes under SLURM: one torchrun per node, started by srun,
# meeting at the first node's address. Submit from the repository root:
#
#   sbatch examples/multigpu_colocate/slurm.sh                    # 2 nodes x 2 GPUs
#   sbatch --nodes 4 examples/multigpu_colocate/slurm.sh --compare
#   GPUS_PER_NODE=8 sbatch --nodes 2 --gpus-per-node 8 examples/multigpu_colocate/slurm.sh
#
# Arguments after the script go to examples.multigpu_colocate.run. What must be shared between
# the nodes, and what the guard does when it is not: docs/integrations.md, "Several nodes".
#SBATCH --job-name=distill-guard-multinode
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=16
#SBATCH --time=00:30:00
#SBATCH --output=%x-%j.out
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-2}
# --out on a filesystem every node sees: rank 0 writes the checkpoints there, every rank loads
# them (and repairs its teacher from them); the guard's event files go there too, one per rank
OUT=${OUT:-$PWD/outputs/multigpu_colocate-${SLURM_JOB_ID:-local}}
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
MASTER_PORT=${MASTER_PORT:-29500}
# NVLink multicast off before anything initialises (run.py sets these too)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The guard's consensus is a gloo group over TCP between every pair of ranks: on hosts with
# several network interfaces name the one the nodes reach each other on, e.g.
# export GLOO_SOCKET_IFNAME=ib0

srun --kill-on-bad-exit=1 torchrun \
    --nnodes "${SLURM_NNODES:-2}" \
    --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-id "${SLURM_JOB_ID:-0}" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    -m examples.multigpu_colocate.run --faulty-rank 1 --out "$OUT" "$@"
