"""TD-MPC2's environments: :func:`make_tdmpc2_env` takes any ``make_env`` task with a continuous
1-D action box and flat observations, and presents actions to the agent in [-1, 1]
(:class:`UnitBoxActions` rescales a Gymnasium box such as Humanoid-v5's [-0.4, 0.4]; DMC envs do
it themselves); :func:`episode_length_of` gives the episode length TD-MPC2 derives its discount
and seed steps from.

``TDMPC2Config.check`` makes the task here too, before any rank starts: this module names the
keys it reads (:class:`EnvKeys`) rather than importing the config.
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from ddprl.envs import make_env
from ddprl.envs.dmc import parse_dmc_task
from ddprl.errors import UsageError


class EnvKeys(Protocol):
    """The keys of TD-MPC2's config (``TDMPC2Config``) that make its env."""

    task: str
    env_kwargs: dict[str, Any]
    episode_length: int | None


class EnvWrapper:
    """Forwards everything it does not override (spaces, render_rgb, state_dict, close)."""

    def __init__(self, env: Any):
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        return self.env.reset(seed=seed)

    def step(self, actions: torch.Tensor):
        return self.env.step(actions)


class UnitBoxActions(EnvWrapper):
    """Present a bounded action box as [-1, 1]: a -> low + (a + 1) (high - low) / 2."""

    def __init__(self, env: Any):
        super().__init__(env)
        space = env.single_action_space
        self._low = torch.as_tensor(space.low, dtype=torch.float32, device=env.device)
        self._half = torch.as_tensor((space.high - space.low) / 2, dtype=torch.float32, device=env.device)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, space.shape, np.float32)

    def step(self, actions: torch.Tensor):
        a = actions.clamp(-1, 1).to(self._low.device)
        return self.env.step(self._low + (a + 1) * self._half)


def make_tdmpc2_env(cfg: EnvKeys, num_envs: int, seed: int, device: torch.device) -> Any:
    """``make_env`` for TD-MPC2: checks the spaces and presents actions in [-1, 1].

    ``cfg.episode_length`` (when set) is the episode length: DMC truncates there itself,
    Gymnasium gets ``max_episode_steps``.
    """
    kwargs = dict(cfg.env_kwargs)
    if cfg.episode_length is not None:
        kwargs["episode_length" if parse_dmc_task(cfg.task) else "max_episode_steps"] = cfg.episode_length
    env = make_env(cfg.task, num_envs, seed=seed, device=device, **kwargs)
    act_space, obs_space = env.single_action_space, env.single_observation_space
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
        env.close()
        raise UsageError(
            f"tdmpc2 needs continuous actions (a 1-D Box); {cfg.task} has {act_space}: "
            "use algo=ppo for discrete actions"
        )
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        env.close()
        raise UsageError(f"tdmpc2 here learns from flat state observations; {cfg.task} observes {obs_space}")
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        env.close()
        raise UsageError(f"{cfg.task} has an unbounded action box; tdmpc2 acts in [-1, 1] and needs bounds")
    if np.any(act_space.low != -1) or np.any(act_space.high != 1):
        env = UnitBoxActions(env)
    return env


def episode_length_of(cfg: EnvKeys, env: Any) -> int:
    """Agent steps per episode: ``cfg.episode_length``, else the task's own time limit."""
    if cfg.episode_length is not None:
        return cfg.episode_length
    length = getattr(env, "max_episode_steps", None)  # DMCVecEnv
    if length is None:
        spec = gym.spec(cfg.task) if cfg.task in gym.registry else None
        length = getattr(spec, "max_episode_steps", None)
    if length is None:
        raise UsageError(
            f"{cfg.task} has no time limit to derive the discount and seed_steps from: "
            "set episode_length=<agent steps per episode>"
        )
    return int(length)
