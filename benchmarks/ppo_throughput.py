"""PPO throughput and sample efficiency: ddprl (world_size 1 and 2) vs Stable-Baselines3.

Same task and hyperparameters for every row (CartPole-v1, 8 envs in total, n_steps 256,
minibatch 256, 10 epochs, lr 3e-4 constant, gamma 0.99, GAE 0.95, clip 0.2, [64, 64] tanh
networks, one thread per process), run one after the other in this one process:

    pip install -e ".[bench]"          # stable-baselines3
    python benchmarks/ppo_throughput.py [--steps 100000] [--repeats 1]

Reported: env steps/s during training (rollout + update, start-up and evaluation excluded),
the ratio to SB3, and the deterministic eval return (10 episodes) at the end of the budget.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import torch

from ddprl.config import load_config
from ddprl.metrics import read_metrics
from ddprl.runtime import launch

SHARED = dict(n_steps=256, batch_size=256, epochs=10, lr=3e-4, gamma=0.99, gae_lambda=0.95, clip_coef=0.2)


def run_ddprl(world_size: int, steps: int, seed: int) -> dict[str, float]:
    from ddprl.algos.ppo.loop import train

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"world_size={world_size}",
            "num_envs=8",
            f"steps={steps}",
            f"seed={seed}",
            "anneal_lr=false",
            "clip_vloss=false",
            "ent_coef=0.0",
            "progress=false",
            "eval_freq=0",
            "eval_episodes=10",
            "checkpoint_freq=0",
            f"run_dir={tmp}/run",
        ]
        overrides += [f"{k}={v}" for k, v in SHARED.items()]
        # batch_size is per rank: N ranks take 256/N each, so every optimizer step averages
        # 256 samples like SB3's (DDP averages the ranks' gradients) and there are as many steps.
        overrides.append(f"batch_size={SHARED['batch_size'] // world_size}")
        cfg = load_config(overrides)
        launch(train, cfg)
        records = read_metrics(f"{tmp}/run")
    steps_done = records[-1]["step"]
    busy = sum(r["time/rollout_s"] + r["time/update_s"] for r in records)
    return {"steps": steps_done, "fps": steps_done / busy, "return": records[-1]["eval/return_mean"]}


def run_sb3(steps: int, seed: int) -> dict[str, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=SHARED["n_steps"],
        batch_size=SHARED["batch_size"],
        n_epochs=SHARED["epochs"],
        learning_rate=SHARED["lr"],
        gamma=SHARED["gamma"],
        gae_lambda=SHARED["gae_lambda"],
        clip_range=SHARED["clip_coef"],
        ent_coef=0.0,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    elapsed = time.perf_counter() - start
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1_000_000)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    return {"steps": model.num_timesteps, "fps": model.num_timesteps / elapsed, "return": float(mean)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=1, help="seeds per row (means are reported)")
    args = parser.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)
    rows: dict[str, list[dict[str, float]]] = {
        "sb3 (1 process)": [],
        "ddprl world_size=1": [],
        "ddprl world_size=2": [],
    }
    for seed in range(1, args.repeats + 1):
        rows["sb3 (1 process)"].append(run_sb3(args.steps, seed))
        rows["ddprl world_size=1"].append(run_ddprl(1, args.steps, seed))
        rows["ddprl world_size=2"].append(run_ddprl(2, args.steps, seed))
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"budget: {args.steps} steps, {args.repeats} seed(s)\n")
    sb3_fps = sum(r["fps"] for r in rows["sb3 (1 process)"]) / args.repeats
    print(f"| {'run':22s} | {'steps/s':>9s} | {'vs SB3':>6s} | {'eval return':>11s} |")
    print(f"|{'-' * 24}|{'-' * 11}|{'-' * 8}|{'-' * 13}|")
    for name, results in rows.items():
        fps = sum(r["fps"] for r in results) / len(results)
        ret = sum(r["return"] for r in results) / len(results)
        print(f"| {name:22s} | {fps:9,.0f} | {fps / sb3_fps:5.2f}x | {ret:11.1f} |")


if __name__ == "__main__":
    main()
