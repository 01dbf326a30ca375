"""The vectorised multi-agent environment contract QMIX sees (cooperative, one team reward).

One rank owns one ``MultiAgentVecEnv`` of ``num_envs`` copies; everything crossing the
boundary is a torch tensor on ``env.device``. Step semantics are those of ``ddprl.envs.base``
(auto-reset in the same step), with the observation replaced by an :class:`MAObs`:

    obs = env.reset(seed)                                   # MAObs
    obs, reward, terminated, truncated, info = env.step(actions)

- ``actions``     (N, A) int64, one discrete action per agent (an available one).
- ``obs``         :class:`MAObs` of the next step; for an env whose episode just ended it is
                  already the first step of its next episode (``obs.first`` is True there).
- ``obs.full``    None, or where the env offers it (SMAX's ``full_obs=True``) every agent's
                  observation with unlimited sight range, in ``obs.obs``'s layout. An env whose
                  observation is a list of unit blocks may also have ``node_layout``
                  (:class:`ddprl.envs.marl.graph.NodeLayout`) to cut it into nodes.
- ``reward``      (N,) float32: the team reward (the sum of the agents' rewards, as EPyMARL).
- ``terminated``  (N,) bool: a terminal state (all food eaten, a goal reached): no bootstrap.
- ``truncated``   (N,) bool: cut by the time limit: bootstrap from ``info["final_obs"]``.
                  Never both; an env that reports its time limit as ``done`` is fixed here.
- ``info["final_obs"]``       MAObs: the true last step where ``terminated | truncated``.
- ``info["episode_return"]``  (N,) float32, ``info["episode_length"]`` (N,) int64: the episode
                              that ended (valid where ``terminated | truncated``).
- further ``info["episode_<x>"]`` per-env tensors named in ``extra_info_keys`` (e.g.
  ``episode_success`` where the env defines success).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch


class MAObs(NamedTuple):
    """One step of N multi-agent envs (A agents, O observation features, S state features, U actions)."""

    obs: torch.Tensor  # (N, A, O) float32: each agent's own observation
    state: torch.Tensor  # (N, S) float32: the global state the mixer sees
    avail: torch.Tensor  # (N, A, U) bool: available actions (at least one True per agent)
    first: torch.Tensor  # (N,) bool: the first step of an episode (recurrent agents reset here)
    # (N, A, O) float32: each agent's observation with unlimited sight, for training a model that
    # fills in what an agent cannot see (never an input to acting); None unless the env was asked
    full: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> MAObs:
        return MAObs(*(None if t is None else t.to(device) for t in self))


class MultiAgentVecEnv(Protocol):
    """N cooperative multi-agent envs stepping together on one device (see the module docstring)."""

    num_envs: int
    device: torch.device
    n_agents: int
    n_actions: int  # U: every agent has the same Discrete(U) action space
    obs_dim: int  # O
    state_dim: int  # S
    episode_limit: int  # the time limit: no episode is longer (the episode buffer's length)
    extra_info_keys: tuple[str, ...]

    def reset(self, seed: int | None = None) -> MAObs:
        """Reset every env; env ``i`` is seeded ``seed + i`` when a seed is given."""
        ...

    def step(self, actions: torch.Tensor) -> tuple[MAObs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]: ...

    def close(self) -> None: ...
