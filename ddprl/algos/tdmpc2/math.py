"""Numerical helpers of TD-MPC2 (Hansen, Wang, Su, ICLR 2024).

Rewards and values are predicted as a categorical distribution over 101 bins laid out evenly
in *symlog* space on [-10, 10] (docs/references.md#losses), trained with a soft cross-entropy
against a two-hot encoding of the scalar target. This makes the losses invariant to the
scale of a task's rewards, which is what lets one set of hyper-parameters work across tasks.

Shapes: ``...`` is any number of leading dims; scalars carry a trailing singleton dim
(``(..., 1)``) and distributions a trailing ``NUM_BINS`` dim (``(..., 101)``).

Nothing here knows about ranks: :class:`RunningScale` takes an optional ``reduce_fn`` so the
caller (the training loop, through the runtime) can average its statistic across ranks.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_BINS = 101
"""Number of bins of the reward / value distributions (TD-MPC2 uses 101)."""
VMIN, VMAX = -10.0, 10.0
"""Support of the bins, in symlog space (TD-MPC2 clamps targets to [-10, 10])."""
BIN_SIZE = (VMAX - VMIN) / (NUM_BINS - 1)  # 0.2


# --------------------------------------------------------------------------- symlog


def symlog(x: torch.Tensor) -> torch.Tensor:
    """sign(x) * log(1 + |x|): compresses large magnitudes, ~identity near 0.

    >>> symlog(torch.tensor([0.0, math.e - 1]))
    tensor([0., 1.])
    """
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`symlog`: sign(x) * (exp(|x|) - 1).

    >>> symexp(symlog(torch.tensor([-5.0, 300.0]))).round()
    tensor([ -5., 300.])
    """
    return torch.sign(x) * torch.expm1(x.abs())


# --------------------------------------------------------------------------- two-hot


def _bins(like: torch.Tensor) -> torch.Tensor:
    # (NUM_BINS,) bin centres in symlog space, built on the caller's device/dtype so that no
    # module-level tensor has to be moved around.
    return torch.linspace(VMIN, VMAX, NUM_BINS, device=like.device, dtype=like.dtype)


def two_hot(x: torch.Tensor) -> torch.Tensor:
    """Encode scalars ``x`` (..., 1) as two-hot vectors (..., 101) in symlog space.

    The mass is split between the two bins that bracket symlog(x), linearly, so the
    expectation over bin centres recovers symlog(x) exactly (inside [-10, 10]; outside the
    value is clamped to the edge bin).

    >>> two_hot(torch.tensor([[0.0]])).argmax(-1)   # symlog(0) = 0 is the middle bin
    tensor([50])
    """
    if x.shape[-1] != 1:
        raise ValueError(f"two_hot expects a trailing singleton dim, got shape {tuple(x.shape)}")
    pos = (symlog(x).clamp(VMIN, VMAX) - VMIN) / BIN_SIZE  # (..., 1) fractional bin index
    low = pos.floor().clamp(max=NUM_BINS - 1)
    upper_w = pos - low  # weight on bin low+1; 0 at the top edge
    low = low.long()
    out = torch.zeros(*x.shape[:-1], NUM_BINS, device=x.device, dtype=x.dtype)
    out.scatter_add_(-1, low, 1.0 - upper_w)
    # At the top edge low+1 would be out of range; its weight is 0 there, so clamping the
    # index (adding 0 to the last bin) keeps the encoding exact without a branch.
    out.scatter_add_(-1, (low + 1).clamp(max=NUM_BINS - 1), upper_w)
    return out


def two_hot_inv(logits: torch.Tensor) -> torch.Tensor:
    """Decode logits (..., 101) to scalars (..., 1): softmax expectation of the bins, symexp.

    >>> two_hot_inv(torch.log(two_hot(torch.tensor([[42.0]])) + 1e-12))
    tensor([[42.0000]])
    """
    probs = F.softmax(logits, dim=-1)
    return symexp((probs * _bins(logits)).sum(-1, keepdim=True))


def soft_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy between predicted logits (..., 101) and the two-hot of ``target`` (..., 1).

    Returns (..., 1), one loss per element, so the caller can weight by rho^t before
    averaging (TD-MPC2's reward and value losses are soft CE on two-hot targets).

    >>> soft_ce(torch.zeros(2, NUM_BINS), torch.zeros(2, 1)).shape
    torch.Size([2, 1])
    """
    return -(two_hot(target) * F.log_softmax(logits, dim=-1)).sum(-1, keepdim=True)


# --------------------------------------------------------------------------- policy


def squash_log_std(raw: torch.Tensor, low: float = -10.0, high: float = 2.0) -> torch.Tensor:
    """Map an unbounded network output to a log-std in [low, high] with a tanh.

    TD-MPC2 squashes the policy prior's log_std into [-10, 2]. A smooth squash
    (rather than a clamp) keeps a gradient at the bounds.

    >>> squash_log_std(torch.tensor([-1e3, 0.0, 1e3]))
    tensor([-10.,  -4.,   2.])
    """
    return low + 0.5 * (high - low) * (torch.tanh(raw) + 1.0)


def gaussian_log_prob(eps: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log density of u = mean + exp(log_std) * eps under N(mean, std), summed over the
    last dim: (..., A) -> (..., 1).

    Written in terms of the standard-normal noise ``eps`` (the reparameterisation sample),
    so the mean drops out: log N(u) = -eps^2/2 - log_std - log(2 pi)/2 per dimension.

    >>> gaussian_log_prob(torch.zeros(1, 2), torch.zeros(1, 2))  # 2 * -log(sqrt(2 pi))
    tensor([[-1.8379]])
    """
    per_dim = -0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    return per_dim.sum(-1, keepdim=True)


def tanh_log_det_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log |d tanh(u) / du| summed over the last dim: (..., A) -> (..., 1).

    Change of variables for a = tanh(u): log p(a) = log p(u) - sum_i log(1 - tanh(u_i)^2).
    Uses log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), which stays finite where
    tanh(u) rounds to +-1 (the naive form gives log(0) = -inf there).

    >>> tanh_log_det_jacobian(torch.zeros(1, 3))
    tensor([[0.]])
    """
    return (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1, keepdim=True)


def squashed_gaussian_sample(
    mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reparameterised sample of a tanh-squashed Gaussian.

    Args: mean, log_std: (..., A) pre-squash parameters; eps: optional (..., A) N(0, 1) noise
    (drawn from the global RNG when None).
    Returns: ``(action, tanh(mean), log_prob)`` with action in (-1, 1) of shape (..., A) and
    log_prob (..., 1) the log density of the squashed action, summed over action dims.

    >>> a, mu, lp = squashed_gaussian_sample(torch.zeros(4, 2), torch.full((4, 2), -3.0))
    >>> a.shape, lp.shape
    (torch.Size([4, 2]), torch.Size([4, 1]))
    """
    if eps is None:
        eps = torch.randn_like(mean)
    u = mean + eps * log_std.exp()
    log_prob = gaussian_log_prob(eps, log_std) - tanh_log_det_jacobian(u)
    return torch.tanh(u), torch.tanh(mean), log_prob


# --------------------------------------------------------------------------- scale


class RunningScale(nn.Module):
    """EMA of the 5th-95th percentile range of Q values, used to normalise the policy loss.

    TD-MPC2 (docs/references.md#losses): an EMA (tau=0.01) of the range between the 5th and
    95th percentiles of Q, never below 1.
    Dividing Q by this scale makes the policy objective (and so the relative weight of the
    entropy bonus) independent of the task's return scale.

    The statistic lives in the buffer ``value`` (shape (1,), starts at 1), so it is saved in
    state dicts. Distributed training: give :meth:`update` the Q values of *all* ranks
    (gathered): every rank then takes the identical EMA step, the one a single process would
    take on the whole batch, and the buffers never drift apart (docs/distributed.md, invariant 2).
    Nothing here is distributed. ``update`` never syncs with the host.

    Example:
        >>> scale = RunningScale()
        >>> scale.update(torch.linspace(0, 100, 1000).unsqueeze(-1))   # range 90 -> EMA
        >>> round(scale.value.item(), 3)                                 # 0.99 * 1 + 0.01 * 90
        1.89
        >>> q_normalised = scale(torch.tensor([[18.9]]))                 # divide by the scale
    """

    def __init__(self, tau: float = 0.01, low_pct: float = 0.05, high_pct: float = 0.95):
        super().__init__()
        self.tau = tau
        self.low_pct, self.high_pct = low_pct, high_pct
        self.register_buffer("value", torch.ones(1))
        # The percentile levels live on the module's device: building them from a Python list in
        # every update would be a blocking host-to-device copy on CUDA. Not saved (persistent=False).
        self.register_buffer("_levels", torch.tensor([low_pct, high_pct]), persistent=False)

    @torch.no_grad()
    def percentile_range(self, x: torch.Tensor) -> torch.Tensor:
        """(1,) tensor: 95th minus 5th percentile of all elements of ``x`` (local batch)."""
        lo, hi = torch.quantile(x.detach().flatten().float(), self._levels)  # x on the module's device
        return (hi - lo).reshape(1).to(self.value.dtype)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """EMA-update ``value`` towards the percentile range of ``x`` (any shape), clamped >= 1."""
        self.value.lerp_(self.percentile_range(x).clamp(min=1.0), self.tau)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x / value (broadcast)."""
        return x / self.value


# --------------------------------------------------------------------------- discount


def discount_for_episode_length(episode_length: int, low: float = 0.95, high: float = 0.995) -> float:
    """Per-task discount heuristic: clip((L/5 - 1) / (L/5), 0.95, 0.995).

    TD-MPC2's discount per task (docs/references.md#schedule-and-discount): L is the episode
    length in *agent* steps (after
    action repeat); longer episodes get a longer horizon. DMC (L = 500) gives 0.99.

    >>> discount_for_episode_length(500)
    0.99
    """
    if episode_length <= 0:
        raise ValueError(f"episode_length must be positive, got {episode_length}")
    frac = episode_length / 5
    return float(min(max((frac - 1) / frac, low), high))
