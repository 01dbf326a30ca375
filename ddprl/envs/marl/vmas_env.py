"""VMAS scenarios (batched in torch, on the rank's device) behind ``MultiAgentVecEnv``.

VMAS is already a vector env, so nothing loops over copies: one ``vmas.Environment`` holds
all ``num_envs`` and every tensor stays on ``device``. What this adapter adds:

- ``terminated_truncated=True``: the scenario's ``done()`` (a goal reached, a package dropped)
  is termination; the step limit ``max_steps`` is truncation. VMAS has no limit by default
  (infinite horizon); here it is ``DEFAULT_TIME_LIMIT`` = 100 steps, the horizon used for
  most VMAS tasks in BenchMARL. An episode that is done by both is terminated.
- same-step auto-reset of the finished envs. VMAS resets one env per ``reset_at(index)``
  call (a Python int), so finding them costs one host sync per step (``done.any()``); the
  whole batch resets in one call when every env is done (the time limit of a batch that
  never terminates early).
- discrete actions, one int per agent (VMAS flattens multi-dimensional discrete actions into
  one Discrete). Agents with fewer actions or smaller observations are padded as in MPE.

Seeding differs from the CPU families: the batch draws from one VMAS RNG stream (kept apart
from the global torch/numpy RNGs by VMAS, and shared by every VMAS env of the process), so
``reset(seed)`` seeds the whole batch with ``seed``; env ``i`` is not seeded ``seed + i``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import vmas

from ddprl.envs.marl.base import MAObs
from ddprl.errors import UsageError

DEFAULT_TIME_LIMIT = 100
# make_env arguments the adapter sets itself: a user value would break the contract.
_RESERVED = (
    "num_envs",
    "device",
    "seed",
    "continuous_actions",
    "dict_spaces",
    "multidiscrete_actions",
    "terminated_truncated",
    "wrapper",
    "wrapper_kwargs",
    "grad_enabled",
    "clamp_actions",
)


def vmas_task_names() -> list[str]:
    return [f"vmas/{name}" for name in sorted(vmas.scenarios + vmas.mpe_scenarios + vmas.debug_scenarios)]


class VmasVecEnv:
    """``num_envs`` copies of a VMAS scenario. kwargs: ``time_limit`` (alias of ``max_steps``)
    and the scenario's own (``n_agents``, ``package_mass``, ...), passed to its ``make_world``;
    one the scenario reports as unused is a UsageError.

    >>> env = VmasVecEnv("balance", num_envs=1024, seed=0)  # doctest: +SKIP
    >>> env.reset().obs.shape
    torch.Size([1024, 4, 16])
    """

    extra_info_keys: tuple[str, ...] = ()

    def __init__(self, scenario: str, num_envs: int, seed: int = 0, device: str | torch.device = "cpu", **kwargs: Any):
        task = f"vmas/{scenario}"
        if "time_limit" in kwargs and "max_steps" in kwargs:
            raise UsageError(f"{task}: give time_limit or max_steps, not both")
        limit = kwargs.pop("time_limit", kwargs.pop("max_steps", DEFAULT_TIME_LIMIT))
        if not (isinstance(limit, int) and limit > 0):
            raise UsageError(f"{task}: time_limit must be a positive int (the episode buffer's length), got {limit!r}")
        reserved = sorted(set(kwargs) & set(_RESERVED))
        if reserved:
            raise UsageError(f"{task}: {', '.join(reserved)} are set by ddprl; the other kwargs go to the scenario")
        self.device = torch.device(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.env = vmas.make_env(
                scenario,
                num_envs=num_envs,
                device=self.device,
                continuous_actions=False,
                seed=seed,
                max_steps=limit,
                terminated_truncated=True,
                **kwargs,
            )
        for w in caught:
            if "passed but not used" in str(w.message):
                raise UsageError(
                    f"{task}: scenario kwargs {', '.join(kwargs)} are not all used by the scenario "
                    f"({w.message}); ddprl's own kwarg is time_limit"
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.num_envs, self.seed, self.episode_limit = num_envs, seed, limit
        self.n_agents = self.env.n_agents
        obs = self._observe()
        if not all(isinstance(o, torch.Tensor) and o.dim() == 2 for o in obs):
            raise UsageError(f"{task}: only flat tensor observations are supported")
        self._obs_sizes = [o.shape[1] for o in obs]
        act_sizes = [int(space.n) for space in self.env.action_space]
        self.obs_dim, self.n_actions = max(self._obs_sizes), max(act_sizes)
        self.state_dim = sum(self._obs_sizes)
        counts = torch.tensor(act_sizes, device=self.device)
        self._avail = torch.arange(self.n_actions, device=self.device) < counts[:, None]  # (A, U)
        self._episode_return = torch.zeros(num_envs, device=self.device)
        self._episode_length = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._seeded = False

    def _observe(self) -> list[torch.Tensor]:
        """Each agent's (N, O_a) observation of the current state, without stepping or resetting."""
        return self.env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)[0]

    def _maobs(self, obs: list[torch.Tensor], first: torch.Tensor) -> MAObs:
        if len(set(self._obs_sizes)) == 1:
            padded = torch.stack(obs, dim=1)
        else:
            padded = torch.zeros(self.num_envs, self.n_agents, self.obs_dim, device=self.device)
            for i, o in enumerate(obs):
                padded[:, i, : o.shape[1]] = o
        avail = self._avail.expand(self.num_envs, -1, -1)  # constant: a read-only view
        return MAObs(padded, torch.cat(obs, dim=1), avail, first)

    def reset(self, seed: int | None = None) -> MAObs:
        """Reset every env; ``seed`` seeds the batch's one stream (see the module docstring).

        The first reset without a seed uses the constructor's seed; later ones continue.
        """
        if seed is None and not self._seeded:
            seed = self.seed
        self._seeded = True
        obs = self.env.reset(seed=seed)
        self._episode_return.zero_()
        self._episode_length.zero_()
        return self._maobs(obs, torch.ones(self.num_envs, dtype=torch.bool, device=self.device))

    def step(self, actions: torch.Tensor):
        actions = actions.to(self.device)
        obs, rewards, terminated, truncated, _ = self.env.step([actions[:, i : i + 1] for i in range(self.n_agents)])
        reward = torch.stack(rewards, dim=1).sum(dim=1).float()
        terminated = terminated.bool()
        truncated = truncated.bool() & ~terminated
        done = terminated | truncated
        self._episode_return += reward
        self._episode_length += 1
        info: dict[str, Any] = {
            "episode_return": self._episode_return.clone(),
            "episode_length": self._episode_length.clone(),
        }
        self._episode_return.masked_fill_(done, 0)
        self._episode_length.masked_fill_(done, 0)
        final = self._maobs(obs, torch.zeros_like(done))
        info["final_obs"] = final
        if not done.any():  # our one host sync: VMAS resets by Python index
            return final, reward, terminated, truncated, info
        if done.all():
            self.env.reset(return_observations=False)  # no seed: the stream continues
        else:
            for index in done.nonzero().squeeze(1).tolist():
                self.env.reset_at(index, return_observations=False)
        return self._maobs(self._observe(), done), reward, terminated, truncated, info

    def render_rgb(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of env 0 (VMAS draws with pyglet, headless through EGL)."""
        return self.env.render(mode="rgb_array", env_index=0, visualize_when_rgb=False)

    def close(self) -> None:
        pass  # VMAS holds only tensors (and a viewer once rendered, freed with the env)
