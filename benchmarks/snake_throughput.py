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
import time

import gymnasium as gym
import harness as h
import torch

from ddprl.config import load_config
from ddprl.envs.snake import SnakeEnv
from ddprl.envs.snake_gym import SnakeGymEnv
from ddprl.metrics import read_metrics
from ddprl.runtime import launch


def env_only_torch(num_envs: int, device: str, steps: int) -> float:
    env = SnakeEnv(num_envs, device=device, seed=0)
    env.reset()
    actions = torch.randint(0, 4, (steps + 5, num_envs), device=device)
    for t in range(steps + 5):
        if t == 5:  # after 5 steps of warm-up
            h.sync(device)
            start = time.perf_counter()
        env.step(actions[t])
    h.sync(device)
    return steps * num_envs / (time.perf_counter() - start)


def env_only_gym(num_envs: int, steps: int) -> float:
    mode = gym.vector.AutoresetMode.SAME_STEP
    envs = gym.vector.SyncVectorEnv([SnakeGymEnv for _ in range(num_envs)], autoreset_mode=mode)
    envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        envs.step(envs.action_space.sample())
    return steps * num_envs / (time.perf_counter() - start)


def end_to_end(task, num_envs, device, precision, compile_, iterations, policy, unroll=2) -> tuple[float, float]:
    """Steps/s of the timed iterations, and the warm-up seconds of the first one."""
    from ddprl.algos.ppo.loop import train

    n_steps, keys = 64, f"task={task} world_size=1 num_envs={num_envs} n_steps=64 epochs=4 device={device} "
    keys += f"batch_size={max(1, num_envs * n_steps // 4)} precision={precision} compile={str(compile_).lower()} "
    keys += f"steps={num_envs * n_steps * (iterations + 1)} progress=false eval_episodes=0 checkpoint_freq=0 "
    keys += f"eval_freq=0 policy=cnn compile_unroll={unroll}"
    with tempfile.TemporaryDirectory() as tmp:
        launch(train, load_config([*keys.split(), f"run_dir={tmp}/run", *policy]))
        first, *rows = read_metrics(f"{tmp}/run")  # the first iteration pays for warm-up and compilation
    seconds = [r["time/rollout_s"] + r["time/update_s"] for r in rows]
    warm_up = first["time/rollout_s"] + first["time/update_s"] - min(seconds)
    return num_envs * n_steps * len(rows) / sum(seconds), warm_up


def main() -> None:
    p = h.parser(__doc__, report=False)
    p.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    p.add_argument("--precisions", nargs="+", default=["fp32"])
    p.add_argument("--compile", choices=["off", "on", "both"], default="off")
    p.add_argument("--unroll", type=int, nargs="+", default=[2], help="compile_unroll values with compile on")
    p.add_argument("--env-steps", type=int, default=200)
    p.add_argument("--iterations", type=int, default=3, help="PPO iterations timed (after one warm-up)")
    p.add_argument("--gym-max-envs", type=int, default=1024)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (ddprl's default is 1)")
    p.add_argument("--policy", nargs="*", default=["policy_width=16", "policy_depth=2", "hidden_sizes=[128]"])
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by the training runs' runtime too
    torch.set_num_threads(args.threads)
    print(f"{h.machine()}\n\n### env only (random actions)\n")
    h.table(["num_envs", "device", "torch Snake steps/s", "SyncVectorEnv steps/s", "ratio"])
    vs = lambda rate, gym: [f"{gym:,.0f}", f"{rate / gym:.1f}x"] if gym else ["-", "-"]  # noqa: E731
    for n in args.num_envs:
        gym_rate = env_only_gym(n, max(20, args.env_steps // 4)) if n <= args.gym_max_envs else None
        for device in args.devices:
            rate = env_only_torch(n, device, args.env_steps)
            h.row([n, device, f"{rate:,.0f}", *vs(rate, gym_rate)])
    if args.skip_train:
        return
    print("\n### end to end PPO training (rollout + update), world_size=1\n")
    runs = [(False, 0)] * (args.compile != "on") + [(True, u) for u in args.unroll] * (args.compile != "off")
    head = ["num_envs", "device", "precision", "compile", "unroll", "task=snake steps/s", "warm-up s"]
    h.table([*head, "SyncVectorEnv steps/s", "ratio"])
    for n in args.num_envs:
        gym_rate = None
        if n <= args.gym_max_envs:
            gym_rate = end_to_end("ddprl/SnakeGym-v0", n, "cpu", "fp32", False, args.iterations, args.policy)[0]
        for device, precision, (comp, unroll) in itertools.product(args.devices, args.precisions, runs):
            rate, warm = end_to_end("snake", n, device, precision, comp, args.iterations, args.policy, unroll or 2)
            h.row([n, device, precision, comp, unroll or "-", f"{rate:,.0f}", f"{warm:.1f}", *vs(rate, gym_rate)])


if __name__ == "__main__":
    main()
