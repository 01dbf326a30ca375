#!/usr/bin/env bash
# Everything issues #3 and #4 still need from one GPU, in phases that each fit a 10-minute
# device command. Run from the repository root on the GPU machine, after
# `bash scripts/gpu_wheels.sh` here (the `device` tool: carry .whl):
#
#   bash benchmarks/gpu_session.sh check     # GPU tests, doctor, CUDA training smoke runs
#   bash benchmarks/gpu_session.sh snake     # Snake throughput on CUDA (target: >= 1M steps/s)
#   bash benchmarks/gpu_session.sh tdmpc2    # TD-MPC2 ms/update, ms/act on CUDA, compile off/on
#   bash benchmarks/gpu_session.sh returns   # TD-MPC2 walker-run learning (as far as time allows)
#   bash benchmarks/gpu_session.sh vmas      # QMIX on VMAS with thousands of envs (issue #10)
#   bash benchmarks/gpu_session.sh jax       # engine=jax: brax/humanoid (MJX) steps/s (issue #11)
#   bash benchmarks/gpu_session.sh regions   # compiled regions / CUDA graphs: TD-MPC2 and Snake (issue #12)
#
# Logs go to $OUT (the device tool's folder that comes back) or ./gpu-logs. ddprl runs from
# the source tree (PYTHONPATH), with the machine's own PyTorch.
set -uo pipefail
phase=${1:?phase: check | snake | tdmpc2 | returns | vmas | jax | regions}
out=${OUT:-gpu-logs}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export MUJOCO_GL=${MUJOCO_GL:-egl} PYTHONUNBUFFERED=1
log="$out/$phase.log"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
} 2>&1 | tee "$log"

case "$phase" in
  check)
    python3 -m pytest -q -m gpu tests/ 2>&1 | tee -a "$log"
    python3 -m ddprl doctor world_size=1 device=cuda 2>&1 | tee -a "$log"
    python3 -m ddprl train task=snake device=cuda world_size=1 num_envs=4096 n_steps=64 batch_size=65536 \
      steps=2000000 eval_freq=0 eval_episodes=64 checkpoint_freq=0 progress=false run_dir=/tmp/snake-smoke 2>&1 | tee -a "$log"
    python3 -m ddprl train algo=tdmpc2 task=walker-run device=cuda world_size=1 model_size=1 steps=3000 \
      seed_steps=2000 eval_episodes=1 eval_freq=0 checkpoint_freq=0 progress=false run_dir=/tmp/tdmpc2-smoke 2>&1 | tee -a "$log"
    python3 -m ddprl eval checkpoint=/tmp/tdmpc2-smoke/checkpoints/latest.pt episodes=1 device=cuda 2>&1 | tee -a "$log"
    ;;
  snake)
    python3 benchmarks/snake_throughput.py --devices cuda --num-envs 4096 16384 65536 262144 --gym-max-envs 0 \
      --precisions fp32 bf16 --compile both --iterations 3 2>&1 | tee -a "$log"
    ;;
  tdmpc2)
    python3 benchmarks/tdmpc2_speed.py --devices cuda --sizes 1 5 19 --compile off on --updates 50 --acts 50 2>&1 | tee -a "$log"
    ;;
  returns)
    # 100k env steps of walker-run take longer than one device command at ~100 agent steps/s:
    # this runs what fits and prints the eval returns reached (compare with REFERENCE.md's curve).
    timeout 540 python3 benchmarks/tdmpc2_returns.py --task walker-run --env-steps 100000 \
      --run-dir /tmp/returns device=cuda compile=true eval_freq=10000 eval_episodes=2 2>&1 | tee -a "$log"
    python3 -c "
from ddprl.metrics import read_metrics
for r in read_metrics('/tmp/returns/run'):
    if 'eval/return_mean' in r: print(r['step'], round(r['wall_time']), r['eval/return_mean'])" 2>&1 | tee -a "$log"
    ;;
  vmas)
    # needs vmas (pip install --target /tmp/site vmas, or carry its wheel in .whl)
    timeout 560 python3 benchmarks/qmix_vmas.py --device cuda --num-envs 1024 4096 16384 --steps 2000000 2>&1 | tee -a "$log"
    ;;
  jax)
    # Needs a CUDA JAX on the machine (jax[cuda12] and its NVIDIA libraries are far over what
    # can travel with the tree) plus optax, gymnax, brax, mujoco-mjx.
    if ! python3 -c "import jax, brax, gymnax, optax; assert jax.default_backend() == 'gpu'" 2>>"$log"; then
      echo "jax phase: no CUDA JAX with brax/gymnax/optax here; nothing measured" | tee -a "$log"; exit 0
    fi
    python3 -m ddprl doctor engine=jax 2>&1 | tee -a "$log"
    for n in 1024 4096; do
      timeout 280 python3 -m ddprl train engine=jax task=brax/humanoid num_envs=$n n_steps=20 \
        batch_size=$((n * 5)) epochs=4 steps=$((n * 20 * 12)) eval_episodes=0 norm_obs=true norm_reward=true \
        run_dir=/tmp/jaxh$n progress=false 2>&1 | tail -3 | tee -a "$log"
      python3 -c "
from ddprl.metrics import read_metrics
rows = read_metrics('/tmp/jaxh$n')
print('humanoid num_envs=$n compile_s', round(rows[0]['time/compile_s'], 1),
      'steps/s (rows 2+)', round(sum(r['time/global_fps'] for r in rows[1:]) / max(1, len(rows) - 1)))" 2>&1 | tee -a "$log"
    done
    XLA_FLAGS= timeout 200 python3 -m ddprl train engine=jax task=gymnax/CartPole-v1 num_envs=2048 n_steps=32 \
      batch_size=8192 epochs=4 steps=2000000 eval_freq=262144 run_dir=/tmp/jaxcp progress=false 2>&1 | tail -2 | tee -a "$log"
    ;;
  regions)
    # Issue #12 in one device command (< 10 min): the GPU tests of the regions (CUDA graphs
    # recorded, replays equal to eager, no host sync in a replay), then the two tables.
    # Targets: TD-MPC2 walker-run model_size 5 >= 183 agent steps/s (3x the official compiled
    # code's 61), compile warm-up <= 60 s; Snake >= 1M end-to-end steps/s.
    timeout 150 python3 -m pytest -q -m gpu tests/test_tdmpc2_regions.py tests/test_ppo_regions.py 2>&1 | tail -5 | tee -a "$log"
    timeout 200 python3 benchmarks/tdmpc2_speed.py --devices cuda --sizes 5 --compile off on --updates 100 --acts 100 \
      --task walker-run 2>&1 | tee -a "$log"
    timeout 100 python3 benchmarks/tdmpc2_speed.py --devices cuda --sizes 5 --compile on --updates 100 --acts 100 \
      --task dog-run 2>&1 | tee -a "$log"
    timeout 120 python3 benchmarks/snake_throughput.py --devices cuda --num-envs 16384 65536 --gym-max-envs 0 \
      --precisions bf16 --compile both --unroll 4 --iterations 3 2>&1 | tee -a "$log"
    ;;
  *)
    echo "unknown phase $phase" >&2; exit 2 ;;
esac
