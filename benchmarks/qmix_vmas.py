"""QMIX on VMAS end to end: env steps/s of whole training runs with thousands of batched envs.

    python benchmarks/qmix_vmas.py [--device cuda] [--num-envs 1024 4096 16384] [--steps 2000000]
        [--scenario balance] [--world-size 1]

For every --num-envs, two measurements on the same device, one after the other:

    env only   random actions through ddprl's VMAS adapter (auto-reset included): the ceiling
    QMIX       ``ddprl train algo=qmix task=vmas/<scenario>`` (batch 32 episodes per rank,
               one update per episode limit of global steps, no evaluation); its
               ``time/global_fps`` averaged over the rows after the first (warm-up excluded)

Numbers are env steps (one step of one env, all agents acting) per second, summed over ranks.
On a CPU use small --num-envs (VMAS resets finished envs one at a time: see docs/qmix.md).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddprl.algos.qmix.learner import select_actions
from ddprl.envs.marl import make_marl_env
from ddprl.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent


def env_only(scenario: str, num_envs: int, device: str, seconds: float = 10.0) -> float:
    env = make_marl_env(f"vmas/{scenario}", num_envs, seed=0, device=device)
    obs = env.reset(seed=0)
    zeros = torch.zeros(obs.avail.shape, device=device)
    steps, start = 0, None
    while True:
        obs, *_ = env.step(select_actions(zeros, obs.avail, 1.0))
        if device == "cuda":
            torch.cuda.synchronize()
        steps += 1
        if steps == 5:  # warm-up done
            start, first = time.perf_counter(), steps
        elif start is not None and time.perf_counter() - start > seconds:
            return (steps - first) * num_envs / (time.perf_counter() - start)


def qmix_run(scenario: str, num_envs: int, device: str, steps: int, world_size: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "ddprl",
            "train",
            "algo=qmix",
            f"task=vmas/{scenario}",
            f"steps={steps}",
            f"num_envs={num_envs}",
            f"world_size={world_size}",
            f"device={device}",
            "eval_freq=0",
            "eval_episodes=0",
            "checkpoint_freq=0",
            "progress=false",
            f"log_freq={steps // 10}",
            f"run_dir={tmp}/run",
        ]
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        fps = [r["time/global_fps"] for r in read_metrics(Path(tmp) / "run") if "time/global_fps" in r]
    return statistics.mean(fps[1:]) if len(fps) > 1 else fps[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=2_000_000)
    parser.add_argument("--scenario", default="balance")
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()
    hardware = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"### QMIX on vmas/{args.scenario}: {hardware}, torch {torch.__version__}, world_size {args.world_size}\n")
    print("| envs | env only (steps/s) | QMIX end to end (steps/s) | QMIX / env only |")
    print("|---|---|---|---|")
    for n in args.num_envs:
        raw = env_only(args.scenario, n, args.device)
        steps = max(args.steps, n * 200)  # at least 200 vector steps: a few updates and rows
        full = qmix_run(args.scenario, n * args.world_size, args.device, steps, args.world_size)
        print(
            f"| {n * args.world_size:,} | {raw * args.world_size:,.0f} | {full:,.0f} "
            f"| {full / raw / args.world_size:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
