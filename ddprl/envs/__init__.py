"""``make_env``: one rank's vectorised environment, whatever the task's origin."""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import torch

from ddprl.envs.base import VecEnv, env_seed
from ddprl.errors import UsageError

__all__ = ["make_env", "check_task", "VecEnv", "env_seed"]

# Tasks implemented by ddprl itself, on top of every registered Gymnasium id.
BUILTIN_TASKS: dict[str, str] = {}


def check_task(task: str) -> None:
    """Raise a UsageError naming near matches when ``task`` is no known environment."""
    if task in BUILTIN_TASKS or task in gym.registry:
        return
    names = list(BUILTIN_TASKS) + list(gym.registry)
    near = difflib.get_close_matches(task, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UsageError(f"unknown task {task!r}{hint}; use a Gymnasium id such as CartPole-v1")


def make_env(task: str, num_envs: int, seed: int, device: str | torch.device = "cpu", **kwargs: Any) -> VecEnv:
    """``num_envs`` environments of ``task`` on ``device``; env ``i`` seeded ``seed + i``.

    Callers pass ``seed=env_seed(cfg.seed, rank)`` so ranks never share a seed.
    """
    check_task(task)
    from ddprl.envs.gym_vec import GymVecEnv

    return GymVecEnv(task, num_envs, seed=seed, device=device, **kwargs)
