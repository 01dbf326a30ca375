#!/usr/bin/env bash
# What ddprl needs checked and measured on one GPU, each phase one device command of at most 10 minutes, from the
# repository root after `bash scripts/gpu_wheels.sh` here (the device tool: carry .whl). Logs: $OUT or ./gpu-logs.
#
#   all1     GPU tests, doctor, smoke runs: PPO (+ eval), supervised, QMIX on VMAS
#   all2     smoke runs: Snake, TD-MPC2 eager and compiled, the JAX engine (brax, gymnax)
#   all3     speed tables: Snake (compile off/on), TD-MPC2 (off/on), QMIX on VMAS
#   all      all1, all2, all3 (a machine with no limit a command); each stops within PHASE_BUDGET (460 s)
#   jax      all2's JAX engine steps with brax/humanoid at 1,024 and 4,096 envs, within PHASE_BUDGET too
#   results  the results page's GPU rows: their next seeds (RESULTS_S s, RESULTS_JOBS at once, RESULTS_ROWS)
#   regions  compiled regions: their GPU tests, TD-MPC2 walker-run twice (warm caches; the act as one graph), dog-run
#   ppo      PPO eager against compile=true (CUDA graphs) on CartPole (SB3's keys) and HalfCheetah-v5: whether
#            compile=auto, eager on GPUs until measured, should compile there too
#   atari    PPO Breakout-v5 steps/s at 1 rank (target >= 15,000): env_overlap=false against auto (on: the GPU acts on
#            half of the games while EnvPool steps the other half), the preset's 8 games and 64
#
# GPU_SESSION_DRY=1: all1..all3 on the CPU with tiny sizes, to check this script without a GPU.
set -uo pipefail
phase=${1:?phase: all | all1 | all2 | all3 | results | jax | regions | ppo | atari}
if [ "$phase" = all ]; then
  failed=0
  for p in all1 all2 all3; do bash "$0" "$p" || failed=1; done
  exit $failed
fi
out=${OUT:-gpu-logs}
mkdir -p "$out"
if [ -d .whl ] && [ "${GPU_SESSION_DRY:-0}" != 1 ]; then  # once a machine: the wheels stay in /tmp/site
  stamp=$(ls .whl | md5sum | cut -c1-16)
  if [ "$(cat /tmp/site/.ddprl-wheels 2>/dev/null)" != "$stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || { echo "wheel install failed"; exit 1; }
    echo "$stamp" > /tmp/site/.ddprl-wheels
  fi
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export MUJOCO_GL=${MUJOCO_GL:-disable} PYTHONUNBUFFERED=1  # the image has no libEGL; no phase renders
log="$out/$phase.log"
: > "$log"
if [ "${GPU_SESSION_DRY:-0}" = 1 ]; then
  DEV=cpu
  pick() { echo "$2"; }  # pick GPU_VALUE DRY_VALUE
else
  DEV=cuda
  pick() { echo "$1"; }
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  } 2>&1 | tee -a "$log"
fi
RUNS=/tmp/ddprl-gpu-session
PHASE_BUDGET=${PHASE_BUDGET:-$(pick 460 3000)}
phase_start=$SECONDS
summary=()

# step NAME MAX_SECONDS COMMAND...: under `timeout`, never past the phase's budget (skipped with < 20 s left)
step() {
  local name=$1 max=$(pick "$2" $(($2 * 4)))  # a 2-core CPU compiles slower than the GPU machine
  shift 2
  local left=$((PHASE_BUDGET - (SECONDS - phase_start)))
  local limit=$((max < left ? max : left))
  if ((left < 20)); then
    summary+=("$(printf '%-28s skipped (the phase budget of %s s is spent)' "$name" "$PHASE_BUDGET")")
    return
  fi
  echo "=== $name (at most ${limit} s): $*" | tee -a "$log"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]} note=""
  ((rc == 124 || rc == 137)) && note=" (timed out)"
  summary+=("$(printf '%-28s exit %-3s %4s s%s' "$name" "$rc" $((SECONDS - start)) "$note")")
}

finish() {
  printf '=== summary of %s (%s s; budget %s s)\n%s\n' "$phase" $SECONDS "$PHASE_BUDGET" "$(printf '%s\n' "${summary[@]}")" |
    tee -a "$log"
  printf '%s\n' "${summary[@]}" | grep -qv " exit 0 " && exit 1
  exit 0
}

# fps RUN_DIR...: steps/s over each run's metric rows after the first (the warm-up's), and its compile seconds
fps() {
  python3 -c "
import sys
from ddprl.metrics import read_metrics
for run in sys.argv[1:]:
    rows = [r for r in read_metrics(run) if 'time/global_fps' in r]
    later = [r['time/global_fps'] for r in rows[1:] or rows]
    compile_s = (rows or [{}])[0].get('time/compile_s', '-')
    print(run, 'steps/s:', round(sum(later) / max(1, len(later))), 'compile_s:', compile_s)" "$@"
}

# train NAME KEYS...: ddprl train on this phase's device, one rank, in $RUNS/NAME
train() {
  local name=$1
  shift
  python3 -m ddprl train device=$DEV world_size=1 progress=false checkpoint_freq=0 "run_dir=$RUNS/$name" "$@"
}

export -f train fps pick
export DEV RUNS

# jax_steps ENVS...: the JAX engine's doctor, brax/humanoid at each ENVS, gymnax/CartPole-v1 to its final evaluation
jax_steps() {
  if ! python3 -c "import jax, brax, gymnax, optax; assert '$DEV' == 'cpu' or jax.default_backend() == 'gpu'" \
    >>"$log" 2>&1; then
    summary+=("jax                          skipped: no CUDA JAX with brax, gymnax and optax here (see the log)")
    return
  fi
  step "jax doctor" 45 python3 -m ddprl doctor engine=jax
  local runs=("$RUNS/jax-cartpole")
  for n in "$@"; do
    runs+=("$RUNS/jax-humanoid-$n")
    step "jax brax/humanoid x$n" 180 train jax-humanoid-$n engine=jax task=brax/humanoid num_envs=$n n_steps=20 \
      batch_size=$((n * $(pick 5 10))) epochs=4 steps=$((n * $(pick 240 60))) eval_episodes=0 norm_obs=true \
      norm_reward=true
  done
  step "jax gymnax/CartPole" 60 train jax-cartpole engine=jax task=gymnax/CartPole-v1 num_envs=$(pick 2048 8) \
    n_steps=32 batch_size=$(pick 8192 64) epochs=4 steps=$(pick 1048576 1024) eval_episodes=$(pick 16 2)
  step "jax fps" 15 fps "${runs[@]}"
}

case "$phase" in
  all1)
    rm -rf "$RUNS" && mkdir -p "$RUNS"
    step "gpu tests" 300 python3 -m pytest -q -m gpu tests/
    step "doctor" 45 python3 -m ddprl doctor world_size=1 device=$DEV
    step "ppo CartPole" 75 train ppo task=CartPole-v1 num_envs=8 steps=$(pick 16384 2048) eval_episodes=4
    step "ppo eval" 30 python3 -m ddprl eval checkpoint=$RUNS/ppo/checkpoints/latest.pt episodes=2 device=$DEV
    step "supervised digits" 60 train supervised algo=supervised task=digits epochs=$(pick 5 1)
    step "qmix vmas/balance" 90 train qmix algo=qmix task=vmas/balance num_envs=$(pick 1024 8) \
      steps=$(pick 204800 1600) eval_episodes=$(pick 64 2) log_freq=$(pick 51200 800)
    step "qmix vmas fps" 15 fps $RUNS/qmix
    finish
    ;;
  all2)
    mkdir -p "$RUNS"
    step "snake" 60 train snake task=snake num_envs=$(pick 4096 16) n_steps=$(pick 64 8) batch_size=$(pick 65536 64) \
      steps=$(pick 1048576 256) eval_freq=0 eval_episodes=$(pick 64 2)
    # walker-run: 1000 random steps, the 1000-update burst, 200 steps with an update each, one eval episode
    walker="algo=tdmpc2 task=walker-run model_size=1 steps=$(pick 1200 60) seed_steps=$(pick 1000 40) eval_freq=0
      eval_episodes=1 log_freq=$(pick 400 20) $(pick "" "episode_length=20")"
    step "tdmpc2 eager" 120 train tdmpc2 $walker
    step "tdmpc2 compiled" 180 train tdmpc2-compiled $walker compile=true \
      $(pick "" "horizon=2 iterations=1 num_samples=32 num_elites=4 num_pi_trajs=4 batch_size=8")
    step "snake, tdmpc2 fps" 15 fps $RUNS/snake $RUNS/tdmpc2 $RUNS/tdmpc2-compiled
    jax_steps $(pick 1024 4)
    finish
    ;;
  all3)  # targets: Snake >= 1M steps/s; TD-MPC2 walker-run size 5 >= 183 agent steps/s, warm-up <= 60 s
    step "snake throughput" 150 python3 benchmarks/snake_throughput.py --devices $DEV --num-envs $(pick 65536 16) \
      --gym-max-envs 0 --precisions $(pick bf16 fp32) --compile both --unroll $(pick 4 2) --iterations $(pick 3 1) \
      --env-steps $(pick 200 10) $(pick "" "--policy policy_width=4 policy_depth=1 hidden_sizes=[16]")
    step "tdmpc2 speed" 220 python3 benchmarks/tdmpc2_speed.py --devices $DEV --task walker-run \
      --sizes $(pick 5 1) --compile $(pick "off on" off) --updates $(pick 100 2) --acts $(pick 100 2)
    step "qmix vmas speed" 150 python3 benchmarks/qmix_vmas.py --device $DEV --num-envs $(pick 4096 8) \
      --steps $(pick 409600 1600)
    finish
    ;;
  results)
    # Each row's missing seeds until RESULTS_S (550: a seed took 549 s on an H200); SIGTERM at the limit checkpoints
    # the seed in training into benchmarks/results/work/ (on a warm machine, this phase again goes on from it). The
    # finished seeds come back as $out/results-runs.tgz: unpack into benchmarks/results/, then run.py --page.
    rows=${RESULTS_ROWS:-$(python3 benchmarks/results/run.py --list | awk '/ device=cuda / {print $1}')}
    for row in $rows; do
      left=$((${RESULTS_S:-550} - (SECONDS - phase_start)))
      ((left < 120)) && break  # too short for a compile and a seed's first evaluation
      timeout -s TERM -k 60 "$left" python3 benchmarks/results/run.py "$row" --seeds 3 --resume \
        --jobs "${RESULTS_JOBS:-1}" 2>&1 | tee -a "$log"
      ((PIPESTATUS[0] == 0)) || break  # stopped at the limit (or failed): the time is spent
    done
    kept=$(cd benchmarks/results && for row in $rows; do [ -d "runs/$row" ] && echo "runs/$row"; done)
    [ -n "$kept" ] && tar czf "$out/results-runs.tgz" --exclude=in_progress -C benchmarks/results $kept
    ;;
  jax)
    rm -rf "$RUNS"/jax-* && mkdir -p "$RUNS"
    jax_steps 1024 4096
    finish
    ;;
  regions)  # targets as all3's; the official compiled plan: 2.77 ms an act
    timeout 150 python3 -m pytest -q -x -m gpu tests/test_tdmpc2_regions.py tests/test_ppo_regions.py \
      tests/test_compat.py 2>&1 | tail -5 | tee -a "$log"
    speed="python3 benchmarks/tdmpc2_speed.py --devices cuda --sizes 5 --updates 100 --acts 100 --compile on"
    timeout 110 $speed --task walker-run 2>&1 | tee -a "$log"
    echo "=== the same, a second process (warm compile caches), then the act as one graph" | tee -a "$log"
    timeout 200 $speed whole --task walker-run 2>&1 | tee -a "$log"
    timeout 90 $speed --task dog-run 2>&1 | tee -a "$log"
    ;;
  ppo)
    rm -rf "$RUNS"/ppo-* && mkdir -p "$RUNS"
    quiet="eval_freq=0 eval_episodes=0 steps=$(pick 40960 4096)"
    sb3="num_envs=1 n_steps=2048 batch_size=64 epochs=10 lr=0.0003 anneal_lr=false clip_vloss=false vf_coef=1.0
      ent_coef=0.0 norm_adv=minibatch"
    for compile in false true; do
      step "ppo CartPole compile=$compile" 120 train ppo-cartpole-$compile task=CartPole-v1 $sb3 $quiet compile=$compile
      step "ppo HalfCheetah compile=$compile" 150 train ppo-halfcheetah-$compile task=HalfCheetah-v5 $quiet \
        compile=$compile
    done
    step "ppo fps" 15 fps "$RUNS"/ppo-*
    finish
    ;;
  atari)
    rm -rf "$RUNS"/atari-* && mkdir -p "$RUNS"
    for envs in 8 $(pick 64 4); do
      for overlap in false auto; do
        step "Breakout x$envs env_overlap=$overlap" 100 train atari-$envs-$overlap task=Breakout-v5 num_envs=$envs \
          steps=$(pick $((envs * 128 * 12)) 2048) eval_freq=0 eval_episodes=0 compile=false env_overlap=$overlap
      done
    done
    step "atari fps" 15 fps "$RUNS"/atari-*
    finish
    ;;
  *)
    echo "unknown phase $phase" >&2; exit 2 ;;
esac
