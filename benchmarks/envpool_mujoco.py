"""MuJoCo on EnvPool against Gymnasium: env steps/s of ``--envs`` HalfCheetah-v4 envs stepping random actions
for ``--seconds`` each, through ``ddprl.envs.make_env`` as training builds them (env_backend=envpool, EnvPool's
one worker thread; env_backend=gymnasium, a SyncVectorEnv), alternated ``--repeats`` times; then ``ddprl train`` with
each back-end (``--train-steps``, 0: skipped), the median of its ``time/global_fps`` and its wall time. Run it on a core
of its own with one thread, as the numbers in docs/benchmarks.md:

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 1 python benchmarks/envpool_mujoco.py [--envs 8] [--seconds 10]
        [--repeats 3] [--train-steps 20480]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ddprl.envs import make_env

TASK, BACKENDS = "HalfCheetah-v4", ("envpool", "gymnasium")


def steps_per_s(backend: str, envs: int, seconds: float) -> float:
    env = make_env(TASK, envs, seed=1, backend=backend)
    env.reset()
    actions = torch.rand(256, envs, env.single_action_space.shape[0]) * 2 - 1
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[n % 256])
        n += 1
    rate = n * envs / (time.perf_counter() - start)
    env.close()
    return rate


def train(backend: str, steps: int) -> tuple[float, float]:
    """(median time/global_fps, wall s) of one ``ddprl train`` run."""
    keys = [f"task={TASK}", f"env_backend={backend}", "world_size=1", "device=cpu", f"steps={steps}", "eval_freq=0"]
    keys += ["eval_episodes=0", "checkpoint_freq=0", "progress=false"]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "ddprl", "train", *keys, f"run_dir={tmp}/run"]
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - start
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines() if line]
    return statistics.median(r["time/global_fps"] for r in rows if "time/global_fps" in r), wall


def alternated(measure, repeats: int) -> dict[str, list]:
    """``measure(backend)`` for both back-ends, ``repeats`` rounds, the order swapped each round."""
    out: dict[str, list] = {b: [] for b in BACKENDS}
    for r in range(repeats):
        for b in BACKENDS[r % 2 :] + BACKENDS[: r % 2]:
            out[b].append(measure(b))
            print(f"round {r + 1} {b}: {out[b][-1]}", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-steps", type=int, default=20480)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rates = alternated(lambda b: steps_per_s(b, a.envs, a.seconds), a.repeats)
    for b, r in rates.items():
        print(f"{TASK} x{a.envs} {b}: median {statistics.median(r):,.0f} env steps/s of {[round(x) for x in r]}")
    if a.train_steps:
        for b, runs in alternated(lambda b: train(b, a.train_steps), a.repeats).items():
            fps, wall = statistics.median(f for f, _ in runs), statistics.median(w for _, w in runs)
            print(f"ddprl train {TASK} steps={a.train_steps} env_backend={b}: median {fps:,.0f} fps, {wall:.1f} s wall")


if __name__ == "__main__":
    main()
