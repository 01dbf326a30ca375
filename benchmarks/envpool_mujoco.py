"""MuJoCo on EnvPool against Gymnasium: env steps/s of ``--envs`` HalfCheetah-v4 envs stepping random actions
for ``--seconds`` each, through ``ddprl.envs.make_env`` as training builds them (env_backend=envpool, EnvPool's
one worker thread; env_backend=gymnasium, a SyncVectorEnv), alternated ``--repeats`` times; then ``ddprl train`` with
each back-end (``--train-steps``, 0: skipped), the median of its ``time/global_fps`` and its wall time. Run it on a core
of its own with one thread, as the numbers in docs/benchmarks.md:

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 1 python benchmarks/envpool_mujoco.py [--envs 8] [--seconds 10]
        [--repeats 3] [--train-steps 20480]
"""

from __future__ import annotations

import itertools
import warnings

import harness as h
import torch

from ddprl.envs import make_env

TASK, BACKENDS = "HalfCheetah-v4", ("envpool", "gymnasium")


def steps_per_s(backend: str, envs: int, seconds: float) -> dict:
    env = make_env(TASK, envs, seed=1, backend=backend)
    env.reset()
    actions = itertools.cycle(torch.rand(256, envs, env.single_action_space.shape[0]) * 2 - 1)
    rate = envs * h.calls_per_s(lambda: env.step(next(actions)), seconds=seconds)
    env.close()
    return {"rate": rate, "say": f"{rate:,.0f} env steps/s"}


def train(backend: str, steps: int) -> dict:
    """The median ``time/global_fps`` and the wall s of one ``ddprl train`` run."""
    keys = [f"task={TASK}", f"env_backend={backend}", "world_size=1", "device=cpu", f"steps={steps}", *h.QUIET]
    run = h.train(keys)
    fps = h.median(h.column(run["rows"], "time/global_fps"))
    return {"fps": fps, "wall": run["wall"], "say": f"{fps:,.0f} fps, {run['wall']:.1f} s wall"}


def main() -> None:
    p = h.parser(__doc__, repeats=3)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--train-steps", type=int, default=20480)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rates = h.alternate({b: lambda r, b=b: steps_per_s(b, a.envs, a.seconds) for b in BACKENDS}, a.repeats)
    for b, runs in rates.items():
        r = h.column(runs, "rate")
        print(f"{TASK} x{a.envs} {b}: median {h.median(r):,.0f} env steps/s of {[round(x) for x in r]}")
    if a.train_steps:
        for b, runs in h.alternate({b: lambda r, b=b: train(b, a.train_steps) for b in BACKENDS}, a.repeats).items():
            fps, wall = h.median(h.column(runs, "fps")), h.median(h.column(runs, "wall"))
            print(f"ddprl train {TASK} steps={a.train_steps} env_backend={b}: median {fps:,.0f} fps, {wall:.1f} s wall")


if __name__ == "__main__":
    main()
