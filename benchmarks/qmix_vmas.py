"""QMIX on VMAS: env steps/s of random actions through ddprl's VMAS adapter (the ceiling) and of whole QMIX training
runs (``time/global_fps`` over the rows after the first), for each --num-envs.

    python benchmarks/qmix_vmas.py [--device cuda] [--num-envs 1024 4096] [--steps 2000000] [--world-size 1]
"""

from __future__ import annotations

import statistics
import sys

import harness as h
import torch

from ddprl.algos.qmix.learner import select_actions
from ddprl.envs.marl import make_marl_env


def env_only(scenario: str, num_envs: int, device: str, seconds: float = 10.0) -> float:
    env = make_marl_env(f"vmas/{scenario}", num_envs, seed=0, device=device)
    avail = env.reset(seed=0).avail  # the same at every step on VMAS
    zeros = torch.zeros(avail.shape, device=device)
    rate = h.calls_per_s(lambda: env.step(select_actions(zeros, avail, 1.0)), device, seconds=seconds, warmup=5)
    return rate * num_envs


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num-envs", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--scenario", default="balance")
    p.add_argument("--world-size", type=int, default=1)
    args, rows = p.parse_args(), []
    n = args.world_size
    for envs in args.num_envs:
        raw, steps = env_only(args.scenario, envs, args.device) * n, max(args.steps, envs * 200)  # a few rows
        keys = f"algo=qmix task=vmas/{args.scenario} steps={steps} num_envs={envs * n} world_size={n} "
        keys += f"device={args.device} log_freq={steps // 10} " + " ".join(h.QUIET)
        fps = h.column(h.train(keys)["rows"], "time/global_fps")
        full = statistics.mean(fps[1:] or fps)
        rows.append([f"{envs * n:,}", f"{raw:,.0f}", f"{full:,.0f}", f"{full / raw:.2f}"])
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"### QMIX on vmas/{args.scenario}: {h.machine()}, {args.device}, world_size {n}\n")
    h.table(["envs", "env only (steps/s)", "QMIX end to end (steps/s)", "QMIX / env only"], rows)


if __name__ == "__main__":
    main()
