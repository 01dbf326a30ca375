"""Train TD-MPC2 on a task for N environment steps; print the eval return next to the paper's.

    python benchmarks/tdmpc2_returns.py --task walker-run --env-steps 100000
    python benchmarks/tdmpc2_returns.py --task cartpole-swingup --env-steps 100000 --world-size 4 compile=true
    python benchmarks/tdmpc2_returns.py --task walker-run --env-steps 20000 model_size=1 batch_size=64   # a smoke run

Environment steps are the published CSVs' unit: for DMC, agent steps x 2 (action repeat), so
``--env-steps 100000`` trains ``steps=50000``. Extra ``key=value`` arguments go to
``ddprl train``. The result is the mean return of ``eval_episodes`` episodes at the end of
training (``eval/return_mean`` in the run's metrics.jsonl) and, when the run evaluated along
the way, its curve in environment steps.

Published TD-MPC2 returns, mean over 3 seeds (docs/references.md#published-returns), by environment steps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PUBLISHED = {  # task: {env steps: return}
    "walker-run": {100_000: 723, 500_000: 820, 1_000_000: 842, 4_000_000: 877},
    "cheetah-run": {100_000: 519, 500_000: 758, 1_000_000: 844, 4_000_000: 896},
    "humanoid-walk": {100_000: 1, 500_000: 278, 1_000_000: 628, 14_000_000: 900},
    "dog-run": {100_000: 27, 500_000: 133, 1_000_000: 170, 14_000_000: 870},
    "cartpole-swingup": {100_000: 839, 500_000: 876, 1_000_000: 876},
    "reacher-easy": {100_000: 937, 500_000: 919, 1_000_000: 983},
    "walker-walk": {100_000: 962, 500_000: 979, 1_000_000: 981},
}


def published_at(task: str, env_steps: int) -> str:
    table = PUBLISHED.get(task)
    if not table:
        return "no published number"
    if env_steps in table:
        return f"{table[env_steps]} at {env_steps:,}"
    below = [s for s in table if s <= env_steps]
    above = [s for s in table if s >= env_steps]
    parts = []
    if below:
        parts.append(f"{table[max(below)]} at {max(below):,}")
    if above:
        parts.append(f"{table[min(above)]} at {min(above):,}")
    return " / ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="walker-run")
    parser.add_argument(
        "--env-steps", type=int, default=100_000, help="environment steps (agent steps x action repeat)"
    )
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-dir", default="", help="default: a temporary directory")
    parser.add_argument("overrides", nargs="*", help="more key=value for ddprl train")
    args = parser.parse_args()

    from ddprl.envs.dmc import ACTION_REPEAT, parse_dmc_task
    from ddprl.metrics import read_metrics

    repeat = ACTION_REPEAT if parse_dmc_task(args.task) else 1
    steps = args.env_steps // repeat
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="tdmpc2-returns-")) / "run"
    cmd = [
        sys.executable,
        "-m",
        "ddprl",
        "train",
        "algo=tdmpc2",
        f"task={args.task}",
        f"steps={steps}",
        f"world_size={args.world_size}",
        f"num_envs={args.world_size}",
        f"seed={args.seed}",
        f"run_dir={run_dir}",
        *args.overrides,
    ]
    print(" ".join(cmd), flush=True)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "disable")}
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        print(f"training failed (exit {proc.returncode})", file=sys.stderr)
        return proc.returncode

    records = [r for r in read_metrics(run_dir) if "eval/return_mean" in r]
    if not records:
        print("no evaluation in the run (eval_episodes=0?)", file=sys.stderr)
        return 1
    print(f"\nTD-MPC2 {args.task}, world_size {args.world_size}, seed {args.seed} (run: {run_dir})")
    print(f"{'env steps':>10} {'agent steps':>11} {'eval return':>12}")
    for r in records:
        print(f"{r['step'] * repeat:>10,} {r['step']:>11,} {r['eval/return_mean']:>8.1f} ± {r['eval/return_std']:.0f}")
    last = records[-1]
    print(
        f"\nfinal: {last['eval/return_mean']:.1f} after {last['step'] * repeat:,} env steps | "
        f"published (3 seeds): {published_at(args.task, last['step'] * repeat)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
