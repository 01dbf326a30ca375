"""PPO's clipped surrogate objective (Schulman et al. 2017, eq. 7) with value and entropy terms."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ddprl.algos.ppo.networks import PolicyOutput


def ppo_loss(
    out: PolicyOutput,
    old_log_probs: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool,
    vf_coef: float,
    ent_coef: float,
) -> dict[str, torch.Tensor]:
    """Loss terms for one minibatch; ``loss`` is what to differentiate. All inputs (B,).

    ``approx_kl`` is the low-variance estimator E[(r - 1) - log r] (Schulman's blog "Approximating
    KL divergence"); ``clip_frac`` the share of samples whose ratio left [1-c, 1+c].
    """
    log_ratio = out.log_prob - old_log_probs
    ratio = log_ratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = old_values + (out.value - old_values).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((out.value - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((out.value - returns) ** 2).mean()
    entropy = out.entropy.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_frac = ((ratio - 1).abs() > clip_coef).float().mean()
    return {
        "loss": pg_loss - ent_coef * entropy + vf_coef * v_loss,
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": approx_kl,
        "clip_frac": clip_frac,
    }


def standardize(advantages: torch.Tensor, reduce_mean: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``(a - mean) / (std + 1e-8)`` with the mean and (population) std of ``advantages`` over
    all ranks: ``reduce_mean`` averages a tensor over ranks, whose shares are of equal size, so
    the mean of their means is the global mean (and likewise for the squares)."""
    moments = reduce_mean(torch.stack([advantages.mean(), (advantages**2).mean()]).float())
    mean = moments[0]
    std = (moments[1] - mean**2).clamp_min(0).sqrt()
    return (advantages - mean) / (std + 1e-8)
