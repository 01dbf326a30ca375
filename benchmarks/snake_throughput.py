"""Snake steps/s: env only (random actions) of the batched torch ``SnakeEnv`` and of Gymnasium's ``SyncVectorEnv`` of
the numpy game, then end-to-end PPO (world_size 1, rollout + update) of task=snake and task=ddprl/SnakeGym-v0, with
precision and compiled regions (``--unroll``: env steps per rollout graph); warm-up s = the first iteration's time minus
the fastest timed one's.

    python benchmarks/snake_throughput.py --num-envs 256 1024 --devices cpu [--compile both --unroll 1 2 4]
        [--precisions fp32 bf16] [--gym-max-envs 0] [--env-steps 50] [--iterations 2] [--policy KEY=VALUE ...]
"""

from __future__ import annotations

import itertools
import os
import tempfile

import gymnasium as gym
import harness as h
import torch

from ddprl.config import load_config
from ddprl.envs.snake import SnakeEnv
from ddprl.envs.snake_gym import SnakeGymEnv
from ddprl.metrics import read_metrics
from ddprl.runtime import launch


def env_only(num_envs: int, device: str | None, steps: int) -> float:
    """Env steps/s of random actions: the torch ``SnakeEnv`` on ``device`` (5 steps of warm-up first), or with no
    device Gymnasium's ``SyncVectorEnv`` of the numpy game."""
    if device is None:
        mode = gym.vector.AutoresetMode.SAME_STEP
        envs = gym.vector.SyncVectorEnv([SnakeGymEnv for _ in range(num_envs)], autoreset_mode=mode)
        envs.reset(seed=0)
        return num_envs * h.calls_per_s(lambda: envs.step(envs.action_space.sample()), calls=steps)
    env = SnakeEnv(num_envs, device=device, seed=0)
    env.reset()
    actions = iter(torch.randint(0, 4, (steps + 5, num_envs), device=device))
    return num_envs * h.calls_per_s(lambda: env.step(next(actions)), device, calls=steps, warmup=5)


def end_to_end(task: str, num_envs: int, device: str, precision: str, unroll: int, args) -> tuple[float, float]:
    """Steps/s of the timed iterations, and the warm-up seconds of the first one (``unroll`` 0: not compiled)."""
    from ddprl.algos.ppo.loop import train

    n_steps, keys = 64, f"task={task} world_size=1 num_envs={num_envs} n_steps=64 epochs=4 device={device} "
    keys += f"batch_size={max(1, num_envs * n_steps // 4)} precision={precision} compile={str(unroll > 0).lower()} "
    keys += f"steps={num_envs * n_steps * (args.iterations + 1)} policy=cnn compile_unroll={unroll or 2}"
    with tempfile.TemporaryDirectory() as tmp:
        launch(train, load_config([*keys.split(), *h.QUIET, f"run_dir={tmp}/run", *args.policy]))
        first, *rows = read_metrics(f"{tmp}/run")  # the first iteration pays for warm-up and compilation
    seconds = [r["time/rollout_s"] + r["time/update_s"] for r in rows]
    warm_up = first["time/rollout_s"] + first["time/update_s"] - min(seconds)
    return num_envs * n_steps * len(rows) / sum(seconds), warm_up


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    p.add_argument("--precisions", nargs="+", default=["fp32"])
    p.add_argument("--compile", choices=["off", "on", "both"], default="off")
    p.add_argument("--unroll", type=int, nargs="+", default=[2], help="compile_unroll values with compile on")
    p.add_argument("--env-steps", type=int, default=200)
    p.add_argument("--iterations", type=int, default=3, help="PPO iterations timed (after one warm-up)")
    p.add_argument("--gym-max-envs", type=int, default=1024)
    p.add_argument("--policy", nargs="*", default=["policy_width=16", "policy_depth=2", "hidden_sizes=[128]"])
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # ddprl's default, read by the training runs' runtime too
    torch.set_num_threads(1)
    print(f"{h.machine()}\n\n### env only (random actions)\n")
    h.table(["num_envs", "device", "torch Snake steps/s", "SyncVectorEnv steps/s", "ratio"])
    vs = lambda rate, gym: [f"{gym:,.0f}", f"{rate / gym:.1f}x"] if gym else ["-", "-"]  # noqa: E731
    for n in args.num_envs:
        gym_rate = n <= args.gym_max_envs and env_only(n, None, max(20, args.env_steps // 4))
        for device in args.devices:
            rate = env_only(n, device, args.env_steps)
            h.row([n, device, f"{rate:,.0f}", *vs(rate, gym_rate)])
    print("\n### end to end PPO training (rollout + update), world_size=1\n")
    unrolls = [0] * (args.compile != "on") + args.unroll * (args.compile != "off")
    head = ["num_envs", "device", "precision", "compile", "unroll", "task=snake steps/s", "warm-up s"]
    h.table([*head, "SyncVectorEnv steps/s", "ratio"])
    for n in args.num_envs:
        gym_rate = n <= args.gym_max_envs and end_to_end("ddprl/SnakeGym-v0", n, "cpu", "fp32", 0, args)[0]
        for device, precision, unroll in itertools.product(args.devices, args.precisions, unrolls):
            rate, warm = end_to_end("snake", n, device, precision, unroll, args)
            h.row([n, device, precision, unroll > 0, unroll or "-", f"{rate:,.0f}", f"{warm:.1f}", *vs(rate, gym_rate)])


if __name__ == "__main__":
    main()
