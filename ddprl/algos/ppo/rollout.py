"""PPO's per-rank rollout storage and GAE, all tensors on the rank's device.

``terminated`` and ``truncated`` are stored apart (STYLE.md rule 10): a truncated step
bootstraps from V(final_obs), a terminated one does not; both end the GAE chain.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Rollout(NamedTuple):
    """T steps of N local envs. Shapes: (T, N, ...)."""

    obs: torch.Tensor  # (T, N, *obs_shape) — raw: normalised at update time with the rollout's statistics
    actions: torch.Tensor  # (T, N) or (T, N, A)
    log_probs: torch.Tensor  # (T, N)
    values: torch.Tensor  # (T, N)  V(obs_t)
    rewards: torch.Tensor  # (T, N)
    terminated: torch.Tensor  # (T, N) bool
    truncated: torch.Tensor  # (T, N) bool
    final_values: torch.Tensor  # (T, N)  V(final_obs_t), used where truncated


class RolloutBuffer:
    """Preallocated storage for one rollout of ``n_steps`` x ``num_envs`` on ``device``."""

    def __init__(self, n_steps: int, num_envs: int, obs_shape: tuple, action_shape: tuple,
                 action_dtype: torch.dtype, device: torch.device):
        def z(*shape, dtype=torch.float32):
            return torch.zeros((n_steps, num_envs, *shape), dtype=dtype, device=device)

        self.data = Rollout(
            obs=z(*obs_shape), actions=z(*action_shape, dtype=action_dtype), log_probs=z(), values=z(),
            rewards=z(), terminated=z(dtype=torch.bool), truncated=z(dtype=torch.bool), final_values=z(),
        )
        self.n_steps = n_steps

    def store(self, t: int, **step: torch.Tensor) -> None:
        for name, value in step.items():
            getattr(self.data, name)[t] = value


def compute_gae(
    rollout: Rollout, next_values: torch.Tensor, gamma: float, gae_lambda: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), truncation-aware.

    ``next_values`` (N,) is V of the observation after the last step. Returns
    ``(advantages, returns)``, both (T, N), with returns = advantages + values.

    For step t:  bootstrap = V(final_obs_t) if truncated_t else V(obs_{t+1});
                 delta_t   = r_t + gamma * bootstrap * (1 - terminated_t) - V(obs_t);
                 A_t       = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}.
    """
    T = rollout.rewards.shape[0]
    advantages = torch.zeros_like(rollout.rewards)
    last_gae = torch.zeros_like(next_values)
    done = (rollout.terminated | rollout.truncated).float()
    not_terminated = 1.0 - rollout.terminated.float()
    for t in reversed(range(T)):
        following = next_values if t == T - 1 else rollout.values[t + 1]
        bootstrap = torch.where(rollout.truncated[t], rollout.final_values[t], following)
        delta = rollout.rewards[t] + gamma * bootstrap * not_terminated[t] - rollout.values[t]
        last_gae = delta + gamma * gae_lambda * (1.0 - done[t]) * last_gae
        advantages[t] = last_gae
    return advantages, advantages + rollout.values
