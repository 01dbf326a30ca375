"""Observation normalisation whose statistics are the same on every rank (DESIGN.md invariant 2)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Running mean and variance over all ranks' samples (Chan et al.'s parallel update).

    ``update(x, reduce_sum)`` sums count, sum and sum of squares over ranks with the given
    reduction before merging, so every rank ends with identical statistics.

    >>> rms = RunningMeanStd((3,))
    >>> rms.update(torch.randn(100, 3))
    >>> rms.normalize(torch.zeros(1, 3)).shape
    torch.Size([1, 3])
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(0.0, dtype=torch.float64))
        self.clip, self.eps = clip, eps

    @torch.no_grad()
    def update(self, x: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        x = x.reshape(-1, *self.mean.shape).double()
        # (count, sum, sum of squares) packed in one tensor: one collective per update.
        n = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
        packed = torch.cat([n, x.sum(0).flatten(), (x * x).sum(0).flatten()])
        if reduce_sum is not None:
            packed = reduce_sum(packed)
        d = self.mean.numel()
        batch_count = packed[0]
        batch_mean = (packed[1:1 + d] / batch_count).reshape(self.mean.shape)
        batch_var = (packed[1 + d:] / batch_count).reshape(self.mean.shape) - batch_mean ** 2
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var.clamp_min(0) * batch_count + delta ** 2 * self.count * batch_count / total
        self.mean += delta * batch_count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        out = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.eps)
        return out.clamp(-self.clip, self.clip)
