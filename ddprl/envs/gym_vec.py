"""A Gymnasium vector env behind ddprl's torch ``VecEnv`` contract (see ``envs/base.py``)."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode


class GymVecEnv:
    """``num_envs`` copies of a ``gymnasium.make`` id stepping in this process (``SyncVectorEnv``).

    Tensors cross the boundary on ``device``; Gymnasium's numpy stays inside. Episode return
    and length are tracked here so every env reports them the same way.

    >>> env = GymVecEnv("CartPole-v1", num_envs=4, seed=0)
    >>> env.reset().shape
    torch.Size([4, 4])
    """

    def __init__(self, task: str, num_envs: int, seed: int = 0, device: str | torch.device = "cpu", **env_kwargs: Any):
        self.task = task
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.seed = seed
        self.envs = gym.vector.SyncVectorEnv(
            [lambda: gym.make(task, **env_kwargs) for _ in range(num_envs)],
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._obs: np.ndarray | None = None

    def _tensor(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=dtype).to(self.device, non_blocking=True)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.envs.reset(seed=self.seed if seed is None else seed)
        self._episode_return[:] = 0
        self._episode_length[:] = 0
        self._obs = obs
        return self._tensor(obs)

    def step(self, actions: torch.Tensor):
        act = actions.detach().cpu().numpy()
        if not self._discrete:
            # The policy's Gaussian is unbounded; the env sees actions clipped to its box.
            act = np.clip(act, self.single_action_space.low, self.single_action_space.high)
        obs, reward, terminated, truncated, info = self.envs.step(act)
        self._episode_return += reward
        self._episode_length += 1
        done = terminated | truncated
        obs_t = self._tensor(obs)
        final_obs_t = obs_t  # most steps end no episode: no copy, no second conversion
        if done.any():
            final_obs = obs.copy()
            for i in np.flatnonzero(done):
                final_obs[i] = info["final_obs"][i]
            final_obs_t = self._tensor(final_obs)
        out_info = {
            "final_obs": final_obs_t,
            "episode_return": self._tensor(self._episode_return.copy()),
            "episode_length": self._tensor(self._episode_length.copy(), torch.int64),
        }
        self._episode_return[done] = 0
        self._episode_length[done] = 0
        self._obs = obs
        return (
            obs_t,
            self._tensor(reward),
            self._tensor(terminated, torch.bool),
            self._tensor(truncated, torch.bool),
            out_info,
        )

    # -- exact resume --------------------------------------------------------------------------
    # A checkpoint taken mid-episode can continue the very same episodes when the simulator's
    # state is reachable: classic control keeps it in ``unwrapped.state``, MuJoCo in qpos/qvel.
    # Other envs return None and are reset (with a fresh seed) on resume.

    def state_dict(self) -> dict[str, Any] | None:
        sims = []
        for env in self.envs.envs:
            sim = _sim_state(env.unwrapped)
            if sim is None or self._obs is None:
                return None
            sims.append({
                "sim": sim,
                "elapsed": int(getattr(env, "_elapsed_steps", 0) or 0),
                # PCG64 states are 128-bit integers: keep them as JSON text.
                "rng": json.dumps(env.unwrapped.np_random.bit_generator.state),
            })
        return {
            "envs": sims,
            "obs": torch.as_tensor(self._obs),
            "episode_return": torch.as_tensor(self._episode_return),
            "episode_length": torch.as_tensor(self._episode_length),
        }

    def load_state_dict(self, state: dict[str, Any]) -> torch.Tensor:
        """Restore :meth:`state_dict` (after ``reset``); returns the current observation."""
        for env, saved in zip(self.envs.envs, state["envs"]):
            _set_sim_state(env.unwrapped, saved["sim"])
            if hasattr(env, "_elapsed_steps"):
                env._elapsed_steps = saved["elapsed"]
            env.unwrapped.np_random.bit_generator.state = json.loads(saved["rng"])
        self._obs = state["obs"].numpy()
        self._episode_return[:] = state["episode_return"].numpy()
        self._episode_length[:] = state["episode_length"].numpy()
        return self._tensor(self._obs)

    def close(self) -> None:
        self.envs.close()


def _sim_state(env: Any) -> dict[str, torch.Tensor] | None:
    if hasattr(env, "data") and hasattr(env, "set_state"):  # Gymnasium MuJoCo
        return {"qpos": torch.as_tensor(env.data.qpos.copy()), "qvel": torch.as_tensor(env.data.qvel.copy())}
    state = getattr(env, "state", None)
    if isinstance(state, (np.ndarray, tuple, list)):
        return {"state": torch.as_tensor(np.asarray(state, dtype=np.float64))}
    return None


def _set_sim_state(env: Any, sim: dict[str, torch.Tensor]) -> None:
    if "qpos" in sim:
        env.set_state(sim["qpos"].numpy(), sim["qvel"].numpy())
    else:
        original = env.state
        value = sim["state"].numpy()
        env.state = tuple(value.tolist()) if isinstance(original, tuple) else value.astype(np.asarray(original).dtype)
