"""Observation and reward normalisation whose statistics are the same on every rank
(docs/distributed.md, invariant 2)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Running mean and variance over all ranks' samples (Chan et al.'s parallel update).

    ``update(x, reduce_sum)`` sums count, sum and sum of squares over ranks with the given
    reduction before merging, so every rank ends with identical statistics.

    ``mask`` (bool, ``shape``) picks the elements to normalise; the others keep mean 0 and
    variance 1, which :meth:`normalize` leaves exactly as they are in float32 (one-hot columns:
    SB3 normalises Box observations only). It is not saved: the statistics carry its effect.

    >>> rms = RunningMeanStd((3,))
    >>> rms.update(torch.randn(100, 3))
    >>> rms.normalize(torch.zeros(1, 3)).shape
    torch.Size([1, 3])
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8, mask: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0.0, dtype=torch.float64))
        # non-persistent: checkpoints keep the keys they always had
        self.register_buffer(
            "mask", None if mask is None else torch.as_tensor(mask, dtype=torch.bool), persistent=False
        )
        self.clip, self.eps = clip, eps

    @torch.no_grad()
    def update(self, x: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        packed = self.moments(x)  # (count, sum, sum of squares) in one tensor: one collective per update
        self.update_from_moments(reduce_sum(packed) if reduce_sum is not None else packed)

    @torch.no_grad()
    def moments(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s (count, sum, sum of squares), packed in one float64 tensor: sum it over ranks
        (alone or concatenated with other sums) and pass it to :meth:`update_from_moments`."""
        x = x.reshape(-1, *self.mean.shape).double()
        n = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
        return torch.cat([n, x.sum(0).flatten(), (x * x).sum(0).flatten()])

    @torch.no_grad()
    def update_from_moments(self, packed: torch.Tensor) -> None:
        d = self.mean.numel()
        batch_count = packed[0]
        batch_mean = (packed[1 : 1 + d] / batch_count).reshape(self.mean.shape)
        batch_var = (packed[1 + d :] / batch_count).reshape(self.mean.shape) - batch_mean**2
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var.clamp_min(0) * batch_count + delta**2 * self.count * batch_count / total
        self.mean += delta * batch_count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)
        if self.mask is not None:
            self.mean.masked_fill_(~self.mask, 0.0)
            self.var.masked_fill_(~self.mask, 1.0)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        out = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.eps)
        return out.clamp(-self.clip, self.clip)


class ReturnScaler(nn.Module):
    """Reward scaling by the standard deviation of the discounted return, over all ranks.

    What Gymnasium's ``NormalizeReward`` and SB3's ``VecNormalize(norm_reward=True)`` do, for
    PPO on tasks with large rewards (MuJoCo): each env's running discounted return
    G_t = r_t + gamma * G_{t-1} (reset after an episode ends) feeds a :class:`RunningMeanStd`
    whose statistics are reduced over ranks (identical everywhere); rewards are divided by its
    std (not centred: the sign of a reward keeps its meaning) and clipped to +-``clip``.
    ``carry`` (num_envs,) is this rank's G_{t-1}, zeroed where the last episode ended.

    >>> scaler = ReturnScaler(num_envs=2, gamma=0.5)
    >>> scaler.track(torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.bool))[:, 0]
    tensor([1.0000, 1.5000, 1.7500])
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.stats = RunningMeanStd(())  # only its variance is used: scale() divides and clips
        self.register_buffer("carry", torch.zeros(num_envs))
        self.gamma, self.clip, self.eps = gamma, clip, eps

    @torch.no_grad()
    def track(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """Discounted returns (T, N) of a rollout's rewards; advances ``carry`` past it."""
        returns = torch.empty_like(rewards, dtype=torch.float32)
        g = self.carry
        for t in range(rewards.shape[0]):
            g = self.gamma * g + rewards[t].float()
            returns[t] = g
            g = g * (~dones[t]).float()
        self.carry.copy_(g)
        return returns

    @torch.no_grad()
    def update(
        self,
        rewards: torch.Tensor,
        dones: torch.Tensor,
        reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """Track a rollout's returns and merge them (all ranks) into the statistics."""
        self.stats.update(self.track(rewards, dones), reduce_sum=reduce_sum)

    def scale(self, rewards: torch.Tensor) -> torch.Tensor:
        std = torch.sqrt(self.stats.var.to(torch.float32) + self.eps)
        return (rewards / std).clamp(-self.clip, self.clip)
