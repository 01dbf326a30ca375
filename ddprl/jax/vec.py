"""A torch ``VecEnv`` over a :class:`~ddprl.jax.envs.JaxEnv`: ``ddprl eval`` and ``ddprl play``
use the same episode loop, video writer and terminal player for both engines.

Steps one jitted, vmapped call at a time from the host (eval and play are small); training
never goes through here.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ddprl.errors import UsageError
from ddprl.jax.envs import JaxEnv


class JaxVecEnv:
    """``num_envs`` copies of ``env``; env ``i`` is keyed by ``seed + i`` (see ddprl.envs.base)."""

    def __init__(self, env: JaxEnv, num_envs: int, seed: int = 0):
        import jax

        self.env, self.num_envs, self.device = env, num_envs, torch.device("cpu")
        self.task = env.task
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, env.obs_shape, np.float32)
        if env.discrete:
            self.single_action_space: gym.Space = gym.spaces.Discrete(env.action_dim)
        else:
            self.single_action_space = gym.spaces.Box(env.action_low, env.action_high, (env.action_dim,), np.float32)
        self._reset = jax.jit(jax.vmap(env.reset))
        self._step = jax.jit(jax.vmap(env.step))
        self._keys = jax.jit(lambda seed: jax.vmap(jax.random.PRNGKey)(jax.numpy.arange(num_envs) + seed))
        self._seed = seed
        self._state: Any = None
        self._t = 0

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self._seed = self._seed if seed is None else seed
        self._state, obs = self._reset(self._keys(self._seed))
        self._return = np.zeros(self.num_envs, np.float32)
        self._length = np.zeros(self.num_envs, np.int64)
        self._t = 0
        return torch.from_numpy(np.array(obs, np.float32))

    def step(self, actions: torch.Tensor):
        import jax
        import jax.numpy as jnp

        action = jnp.asarray(actions.cpu().numpy())
        if not self.env.discrete:
            action = jnp.clip(action, self.env.action_low, self.env.action_high)
        self._t += 1
        keys = self._keys(self._seed + 1_000_003 * self._t)  # the envs' own randomness, step by step
        self._state, obs, reward, terminated, truncated, final_obs = jax.device_get(
            self._step(keys, self._state, action)
        )
        reward = np.array(reward, np.float32)
        done = np.asarray(terminated) | np.asarray(truncated)
        self._return += reward
        self._length += 1
        info = {
            "final_obs": torch.from_numpy(np.array(final_obs, np.float32)),
            "episode_return": torch.from_numpy(self._return.copy()),
            "episode_length": torch.from_numpy(self._length.copy()),
        }
        self._return[done] = 0.0
        self._length[done] = 0
        return (
            torch.from_numpy(np.array(obs, np.float32)),
            torch.from_numpy(reward),
            torch.from_numpy(np.asarray(terminated, bool).copy()),
            torch.from_numpy(np.asarray(truncated, bool).copy()),
            info,
        )

    def render_rgb(self) -> np.ndarray:
        """A frame of env 0 (classic control through Gymnasium's renderer, brax through MuJoCo's,
        the other gymnax tasks with a scene through ``ddprl.jax.pictures``)."""
        import jax

        if self.env.render is None:
            raise UsageError(
                f"video: {self.env.task} has no scene to draw (bandit and chain tasks observe a few "
                "numbers); ddprl eval gives its returns"
            )
        return self.env.render(jax.tree.map(lambda x: np.asarray(x)[0], self._state))

    def close(self) -> None:
        pass
