"""TD-MPC2 losses (Hansen, Wang, Su, ICLR 2024), each a dict of named terms.

Pure functions of tensors: no module, no optimizer, no rank. Notation: H horizon, B batch,
d latent_dim, Q ensemble members, K = 101 bins. Facts from docs/references.md#losses:

- world model: consistency 20 * sum_t rho^t MSE(z_{t+1}, enc(o_{t+1})) / H, plus reward 0.1 and
  value 0.1 as soft cross-entropies against two-hot targets, weighted by rho^t the same way
  (the value term is also averaged over the Q members);
- policy: on detached latents, maximise Q (the mean of 2 random members, Q parameters
  frozen) divided by the running scale, plus 1e-4 x scaled entropy, weighted by rho^t.

    >>> terms = world_model_loss(out, reward, rho=0.5)         # doctest: +SKIP
    >>> terms["loss"].backward()                              # doctest: +SKIP
"""

from __future__ import annotations

import torch

from ddprl.algos.tdmpc2.math import soft_ce


def rho_weights(length: int, rho: float, like: torch.Tensor) -> torch.Tensor:
    """(length,) weights rho^t, t = 0..length-1: later steps of an imagined rollout count less.

    >>> rho_weights(3, 0.5, torch.zeros(1))
    tensor([1.0000, 0.5000, 0.2500])
    """
    return rho ** torch.arange(length, device=like.device, dtype=torch.float32)


def world_model_loss(
    out: dict[str, torch.Tensor],
    reward: torch.Tensor,
    rho: float = 0.5,
    consistency_coef: float = 20.0,
    reward_coef: float = 0.1,
    value_coef: float = 0.1,
) -> dict[str, torch.Tensor]:
    """The world-model objective from :meth:`WorldModel.forward`'s outputs.

    Args: ``out`` with ``z`` (H+1, B, d) latent rollout, ``next_z`` (H, B, d) encoded next
    observations (no grad), ``reward_logits`` (H, B, K), ``q_logits`` (Q, H, B, K) and
    ``td_target`` (H, B, 1) (no grad); ``reward`` (H, B, 1) the observed rewards.
    Returns ``loss`` (the weighted sum, to backward) and the unweighted ``consistency``,
    ``reward``, ``value`` terms, all scalars. Computed in float32 whatever the autocast.
    """
    z, next_z = out["z"].float(), out["next_z"].float()
    H = next_z.shape[0]
    w = rho_weights(H, rho, z)  # (H,)
    # MSE over batch and latent dims per step (F.mse_loss's mean), then rho-weighted over steps
    consistency = (w * (z[1:] - next_z).pow(2).mean(dim=(1, 2))).sum() / H
    reward_ce = soft_ce(out["reward_logits"].float(), reward.float())  # (H, B, 1)
    reward_term = (w * reward_ce.mean(dim=(1, 2))).sum() / H
    q_logits = out["q_logits"].float()  # (Q, H, B, K)
    value_ce = soft_ce(q_logits, out["td_target"].float().unsqueeze(0).expand(q_logits.shape[0], -1, -1, -1))
    value_term = (w * value_ce.mean(dim=(0, 2, 3))).sum() / H  # mean over members = sum / (H Q) * H
    loss = consistency_coef * consistency + reward_coef * reward_term + value_coef * value_term
    return {"loss": loss, "consistency": consistency, "reward": reward_term, "value": value_term}


def policy_loss(
    q: torch.Tensor, scaled_entropy: torch.Tensor, scale: torch.Tensor, rho: float = 0.5, entropy_coef: float = 1e-4
) -> dict[str, torch.Tensor]:
    """Policy-prior objective: maximise Q / scale + entropy_coef * scaled entropy, rho-weighted.

    Args: ``q`` (T, B, 1) Q of the policy's actions at the detached latents (T = H+1; the
    Q parameters detached, so only the policy learns), ``scaled_entropy`` (T, B, 1) from
    :class:`PolicyPrior`, ``scale`` (1,) the running Q scale (already updated with this
    batch). Returns ``loss``, ``q`` (mean unscaled Q) and ``entropy`` (mean scaled entropy).
    """
    q, scaled_entropy = q.float(), scaled_entropy.float()
    w = rho_weights(q.shape[0], rho, q)  # (T,)
    objective = (entropy_coef * scaled_entropy + q / scale).mean(dim=(1, 2))  # (T,)
    loss = -(w * objective).mean()
    return {"loss": loss, "q": q.detach().mean(), "entropy": scaled_entropy.detach().mean()}
