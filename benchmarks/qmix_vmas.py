"""QMIX on VMAS: env steps/s of random actions through ddprl's VMAS adapter (the ceiling) and of whole QMIX training
runs (``time/global_fps`` over the rows after the first), for each --num-envs.

    python benchmarks/qmix_vmas.py [--device cuda] [--num-envs 1024 4096] [--steps 2000000] [--world-size 1]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness as h
import torch

from ddprl.algos.qmix.learner import select_actions
from ddprl.envs.marl import make_marl_env


def env_only(scenario: str, num_envs: int, device: str, seconds: float = 10.0) -> float:
    env = make_marl_env(f"vmas/{scenario}", num_envs, seed=0, device=device)
    obs = env.reset(seed=0)
    zeros, steps, start = torch.zeros(obs.avail.shape, device=device), -5, 0.0  # 5 steps of warm-up
    while steps <= 0 or time.perf_counter() - start < seconds:
        obs, *_ = env.step(select_actions(zeros, obs.avail, 1.0))
        if device == "cuda":
            torch.cuda.synchronize()
        steps, start = steps + 1, time.perf_counter() if steps == -1 else start
    return steps * num_envs / (time.perf_counter() - start)


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num-envs", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--scenario", default="balance")
    p.add_argument("--world-size", type=int, default=1)
    args, rows = p.parse_args(), []
    n_ranks = args.world_size
    for n in args.num_envs:
        raw, steps = env_only(args.scenario, n, args.device) * n_ranks, max(args.steps, n * 200)  # a few rows
        keys = f"algo=qmix task=vmas/{args.scenario} steps={steps} num_envs={n * n_ranks} world_size={n_ranks} "
        keys += f"device={args.device} log_freq={steps // 10} eval_freq=0 eval_episodes=0 checkpoint_freq=0"
        with tempfile.TemporaryDirectory() as tmp:
            fps = h.column(h.train([*keys.split(), "progress=false"], Path(tmp) / "run")["rows"], "time/global_fps")
        full = statistics.mean(fps[1:] or fps)
        rows.append([f"{n * n_ranks:,}", f"{raw:,.0f}", f"{full:,.0f}", f"{full / raw:.2f}"])
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)

    def report() -> None:
        print(f"### QMIX on vmas/{args.scenario}: {h.machine()}, {args.device}, world_size {n_ranks}\n")
        h.table(["envs", "env only (steps/s)", "QMIX end to end (steps/s)", "QMIX / env only"], rows)

    h.report(report, args.report)


if __name__ == "__main__":
    main()
