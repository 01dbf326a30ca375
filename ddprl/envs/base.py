"""The vectorised-environment contract every ddprl algorithm sees.

One rank owns one ``VecEnv`` of ``local_num_envs`` copies. Everything crossing this boundary
is a torch tensor on ``env.device`` so that the loop never depends on where the environment
lives (a Gymnasium vector env on the CPU, or the batched Snake game living on the GPU).

Step semantics (auto-reset in the same step, Gymnasium's ``SAME_STEP`` mode):

    obs, reward, terminated, truncated, info = env.step(actions)

- ``obs``        (N, *obs_shape) float32: for an env whose episode just ended this is already
                 the first observation of its next episode.
- ``reward``     (N,) float32
- ``terminated`` (N,) bool: the MDP reached a terminal state (no bootstrap).
- ``truncated``  (N,) bool: cut by a time limit (bootstrap from ``info["final_obs"]``).
- ``info["final_obs"]``        (N, *obs_shape): the true last observation where
                               ``terminated | truncated``; unspecified elsewhere.
- ``info["episode_return"]``   (N,) float32: undiscounted return of the episode that ended,
                               valid where ``terminated | truncated``.
- ``info["episode_length"]``   (N,) int64: its length in agent steps, same validity.
- ``info["episode_end"]``      (N,) bool, optional: where the episode that is scored ended, for
                               an env whose learner's episodes are shorter (Atari's episodic
                               life: a lost life terminates, the game goes on); the two entries
                               above are then valid there (a whole game), not at every end.
- further per-env tensors an env wants to report at episode end (Snake: ``episode_score``).

A host env (one that steps outside a graph) hands the caller tensors it does not write again:
PPO's CPU rollout keeps each step's reward and flags until the rollout ends.
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import torch


class VecEnv(Protocol):
    """A batch of environments stepping together on one device (see module docstring)."""

    num_envs: int
    device: torch.device
    single_observation_space: gym.Space
    single_action_space: gym.Space

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every env; env ``i`` is seeded with ``seed + i`` when a seed is given."""
        ...

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step every env once; see the module docstring for shapes and auto-reset."""
        ...

    def close(self) -> None: ...
