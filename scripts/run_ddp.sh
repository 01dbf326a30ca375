#!/usr/bin/env bash
# TD-MPC2 on one node's GPUs through torchrun: one rank, one environment and one replay buffer
# per GPU (docs/tdmpc2.md).
#
#   scripts/run_ddp.sh TASK MODEL_SIZE [NUM_GPUS=8] [SYNC_FREQ=1] [key=value ...]
#   scripts/run_ddp.sh dog-run 48                       # 8 GPUs
#   scripts/run_ddp.sh walker-run 5 4 1 steps=250000 run_dir=runs/walker-4gpu
#
# torchrun --standalone picks a free port. Read from the environment: MUJOCO_GL (default egl),
# PYTHON (default python: the interpreter that has ddprl installed).
set -euo pipefail

if [[ $# -lt 2 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
TASK=$1
MODEL_SIZE=$2
NUM_GPUS=${3:-8}
SYNC_FREQ=${4:-1}
shift $(( $# < 4 ? $# : 4 ))

if ! [[ "$NUM_GPUS" =~ ^[0-9]+$ && "$NUM_GPUS" -ge 1 ]]; then
    echo "run_ddp.sh: NUM_GPUS must be a positive integer, got '$NUM_GPUS'" >&2; exit 2
fi
if ! [[ "$SYNC_FREQ" =~ ^[0-9]+$ && "$SYNC_FREQ" -ge 1 ]]; then
    echo "run_ddp.sh: SYNC_FREQ must be a positive integer, got '$SYNC_FREQ'" >&2; exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    VISIBLE=$(nvidia-smi --list-gpus | wc -l)
    if (( VISIBLE < NUM_GPUS )); then
        echo "run_ddp.sh: asked for $NUM_GPUS GPUs but nvidia-smi lists $VISIBLE" >&2; exit 2
    fi
fi

export MUJOCO_GL=${MUJOCO_GL:-egl}
exec "${PYTHON:-python}" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="$NUM_GPUS" \
    -m ddprl train --config-name tdmpc2_ddp \
    task="$TASK" model_size="$MODEL_SIZE" world_size="$NUM_GPUS" num_envs="$NUM_GPUS" sync_freq="$SYNC_FREQ" "$@"
