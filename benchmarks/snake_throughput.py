"""Snake throughput: the batched torch env vs Gymnasium's SyncVectorEnv of the one-game numpy Snake.

Two measurements, each across ``--num-envs``:

1. env only: random actions, steps/s of ``SnakeEnv`` (on each device given) and of
   ``SyncVectorEnv([SnakeGymEnv] * n)`` (CPU; skipped above ``--gym-max-envs``);
2. end to end: PPO training (rollout + update, the real ddprl loop, world_size=1), steps/s from
   the run's metrics, for ``task=snake`` and for ``task=ddprl/SnakeGym-v0`` (the same game
   through Gymnasium's vector env), with bf16 and compile on/off on CUDA. ``compile=true`` runs
   the compiled regions (the rollout as graphs of ``--unroll`` env steps, each optimizer step one
   graph; CUDA graphs on CUDA); "warm-up s" is the first iteration's time minus a timed one's
   (compiling, CUDA-graph recording), not counted in steps/s.

    python benchmarks/snake_throughput.py --num-envs 256 1024 4096 --devices cpu
    python benchmarks/snake_throughput.py --num-envs 4096 16384 65536 --devices cuda --precisions fp32 bf16 \
        --compile both
    python benchmarks/snake_throughput.py --num-envs 64 --devices cpu --compile both --unroll 1 2 --gym-max-envs 0 \
        --env-steps 50 --iterations 2 --policy policy_width=4 policy_depth=1 "hidden_sizes=[16]"   # CPU, small

Prints markdown tables; ratios are torch / gym at equal num_envs.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import gymnasium as gym
import torch

from ddprl.config import load_config
from ddprl.envs.snake import SnakeEnv
from ddprl.envs.snake_gym import SnakeGymEnv
from ddprl.metrics import read_metrics
from ddprl.runtime import launch


def env_only_torch(num_envs: int, device: str, steps: int) -> float:
    env = SnakeEnv(num_envs, device=device, seed=0)
    env.reset()
    actions = torch.randint(0, 4, (steps, num_envs), device=device)
    for t in range(5):  # warm-up
        env.step(actions[t])
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for t in range(steps):
        env.step(actions[t])
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * num_envs / (time.perf_counter() - start)


def env_only_gym(num_envs: int, steps: int) -> float:
    envs = gym.vector.SyncVectorEnv(
        [lambda: SnakeGymEnv() for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    return steps * num_envs / (time.perf_counter() - start)


def end_to_end(
    task: str,
    num_envs: int,
    device: str,
    precision: str,
    compile_: bool,
    iterations: int,
    policy: list[str],
    unroll: int = 2,
) -> tuple[float, float]:
    """Steps/s of the timed iterations, and the warm-up seconds of the first one."""
    n_steps = 64
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            [
                f"task={task}",
                "world_size=1",
                f"num_envs={num_envs}",
                f"n_steps={n_steps}",
                f"batch_size={max(1, num_envs * n_steps // 4)}",
                "epochs=4",
                f"device={device}",
                f"precision={precision}",
                f"compile={str(compile_).lower()}",
                "progress=false",
                f"steps={num_envs * n_steps * (iterations + 1)}",
                "eval_episodes=0",
                "checkpoint_freq=0",
                "eval_freq=0",
                f"run_dir={tmp}/run",
                "policy=cnn",
                f"compile_unroll={unroll}",
                *policy,
            ]
        )
        from ddprl.algos.ppo.loop import train

        launch(train, cfg)
        first, *records = read_metrics(f"{tmp}/run")  # the first iteration pays for warm-up/compilation
    seconds = [r["time/rollout_s"] + r["time/update_s"] for r in records]
    warm_up = first["time/rollout_s"] + first["time/update_s"] - min(seconds)
    return num_envs * n_steps * len(records) / sum(seconds), warm_up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    parser.add_argument("--precisions", nargs="+", default=["fp32"])
    parser.add_argument("--compile", choices=["off", "on", "both"], default="off")
    parser.add_argument(
        "--unroll",
        type=int,
        nargs="+",
        default=[2],
        help="compile_unroll values to time with compile on (env steps per rollout graph)",
    )
    parser.add_argument("--env-steps", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=3, help="PPO iterations timed (after one warm-up)")
    parser.add_argument("--gym-max-envs", type=int, default=1024)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (ddprl's default is 1)")
    parser.add_argument("--policy", nargs="*", default=["policy_width=16", "policy_depth=2", "hidden_sizes=[128]"])
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by the training runs' runtime too
    torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "")
    )

    print("\n### env only (random actions)\n")
    print("| num_envs | device | torch Snake steps/s | gym SyncVectorEnv steps/s | ratio |")
    print("|---:|---|---:|---:|---:|")
    for n in args.num_envs:
        gym_rate = env_only_gym(n, max(20, args.env_steps // 4)) if n <= args.gym_max_envs else None
        for device in args.devices:
            rate = env_only_torch(n, device, args.env_steps)
            ratio = f"{rate / gym_rate:.1f}x" if gym_rate else "-"
            print(f"| {n} | {device} | {rate:,.0f} | {f'{gym_rate:,.0f}' if gym_rate else '-'} | {ratio} |", flush=True)
    if args.skip_train:
        return

    print("\n### end to end PPO training (rollout + update), world_size=1\n")
    print(
        "| num_envs | device | precision | compile | unroll | task=snake steps/s | warm-up s | SyncVectorEnv steps/s "
        "| ratio |"
    )
    print("|---:|---|---|---|---:|---:|---:|---:|---:|")
    runs = {"off": [(False, 0)], "on": [], "both": [(False, 0)]}[args.compile]
    runs += [(True, u) for u in args.unroll] if args.compile != "off" else []
    for n in args.num_envs:
        gym_rate = (
            end_to_end("ddprl/SnakeGym-v0", n, "cpu", "fp32", False, args.iterations, args.policy)[0]
            if n <= args.gym_max_envs
            else None
        )
        for device in args.devices:
            for precision in args.precisions:
                for comp, unroll in runs:
                    rate, warm_up = end_to_end(
                        "snake", n, device, precision, comp, args.iterations, args.policy, unroll or 2
                    )
                    ratio = f"{rate / gym_rate:.1f}x" if gym_rate else "-"
                    print(
                        f"| {n} | {device} | {precision} | {comp} | {unroll or '-'} | {rate:,.0f} | {warm_up:.1f} | "
                        f"{f'{gym_rate:,.0f}' if gym_rate else '-'} | {ratio} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
