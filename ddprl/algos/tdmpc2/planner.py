"""MPPI planning in the latent space of a TD-MPC2 world model (Hansen, Wang, Su, ICLR 2024).

Settings from REFERENCE.md ("MPPI planner"): horizon 3, 6 iterations (+2 when the action dim
is >= 20), 512 samples, 64 elites, 24 trajectories from the policy prior, temperature 0.5,
std in [0.05, 2], warm start from the previous plan's mean shifted by one step.

The planner knows nothing of environments or of the model class: it takes four callables
(any module with ``next / reward / Q / pi`` works through :meth:`MPPI.from_world_model`).
It plans for E independent start latents at once (one per environment of this rank) and
keeps every step on the device: no ``.item()``, no host-side branching on tensor values
(the elite draw is a Gumbel-max, not ``torch.multinomial``).

Randomness: every random number of a plan is one field of :class:`PlanNoise` (action
samples, policy-prior noise, the terminal Q members, the elite draw, exploration noise). It
is drawn inside :meth:`MPPI.plan` from the global RNG, which a compiled region turns into
graph-safe random kernels, or passed in, drawn by :meth:`MPPI.draw_noise` from a
``torch.Generator``: then eager and compiled plans see the same numbers and choose the same
action (tests). ``plan`` is one function of tensors with static shapes, no host read and
no branch on a tensor's value: ``torch.compile(fullgraph=True)`` captures it whole
(``ddprl.algos.graphs``), a CUDA graph on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from .math import two_hot_inv

Tensor = torch.Tensor


def mppi_iterations(action_dim: int, base: int = 6) -> int:
    """REFERENCE.md: 6 MPPI iterations, 2 more for large action spaces (action_dim >= 20).

    >>> mppi_iterations(6), mppi_iterations(38)
    (6, 8)
    """
    return base + 2 if action_dim >= 20 else base


@dataclass(frozen=True)
class MPPIConfig:
    """MPPI hyper-parameters (REFERENCE.md defaults)."""

    horizon: int = 3
    """planning horizon H in agent steps"""
    iterations: int = 6
    """refinement iterations; use ``mppi_iterations(action_dim)`` for the paper's rule"""
    num_samples: int = 512
    """trajectories per iteration, including the policy-prior ones"""
    num_elites: int = 64
    """top trajectories the mean/std are refit on"""
    num_pi_trajs: int = 24
    """trajectories proposed by rolling out the policy prior"""
    temperature: float = 0.5
    """elite weights are exp(temperature * (V - V_max))"""
    min_std: float = 0.05
    """lower clamp of the sampling std"""
    max_std: float = 2.0
    """initial sampling std and its upper clamp"""


class Plan(NamedTuple):
    """Result of :meth:`MPPI.plan`. action (E, A) to execute; mean (H, E, A) to pass back as
    ``prev_mean`` next step; std (H, E, A) final sampling std."""

    action: Tensor
    mean: Tensor
    std: Tensor


class PlanNoise(NamedTuple):
    """Every random number one plan uses (I iterations, H horizon, E start latents, N
    samples of which P from the policy prior, K elites, A action dims)."""

    samples: Tensor  # (I, H, E, N-P, A) N(0, 1): the Gaussian action samples
    pi_prior: Tensor  # (H, E*P, A) N(0, 1): the policy prior's trajectories
    pi_terminal: Tensor  # (I, E*N, A) N(0, 1): the policy's action at each trajectory's end
    members: Optional[Tensor]  # (I, 2) Q members of the terminal value (None: value_fn takes none)
    elite_u: Tensor  # (E, K) U(0, 1): the Gumbel-max draw of the executed elite
    explore: Tensor  # (E, A) N(0, 1): exploration noise on the executed action


class MPPI:
    """Model predictive path integral planner over latent trajectories.

    Callables (batched over leading dims, shapes for N = E * num_samples rows):
    ``next_fn(z (N, d), a (N, A)) -> (N, d)``, ``reward_fn(z, a) -> (N, 1)`` scalar reward,
    ``value_fn(z, a[, members]) -> (N, 1)`` scalar Q (given the ensemble ``members`` (2,)
    when ``num_q`` is set), ``pi_fn(z, eps) -> (N, A)`` policy-prior action for standard
    normal ``eps`` (may be None when ``num_pi_trajs == 0``).

    Example (toy problem: z' = z + a, reward -(z + a - 0.5)^2, no terminal value):
        >>> mppi = MPPI(lambda z, a: z + a, lambda z, a: -((z + a - 0.5) ** 2).sum(-1, keepdim=True),
        ...             lambda z, a: torch.zeros(*z.shape[:-1], 1), None, action_dim=1,
        ...             discount=0.99, cfg=MPPIConfig(num_pi_trajs=0))
        >>> plan = mppi.plan(torch.zeros(1, 1), eval_mode=True)
        >>> plan.action.shape
        torch.Size([1, 1])
    """

    def __init__(self, next_fn: Callable[[Tensor, Tensor], Tensor], reward_fn: Callable[[Tensor, Tensor], Tensor],
                 value_fn: Callable[..., Tensor], pi_fn: Optional[Callable[[Tensor, Tensor], Tensor]],
                 action_dim: int, discount: float, cfg: MPPIConfig = MPPIConfig(), num_q: Optional[int] = None):
        if cfg.num_pi_trajs > 0 and pi_fn is None:
            raise ValueError("pi_fn is required when cfg.num_pi_trajs > 0")
        if cfg.iterations < 1:
            raise ValueError("cfg.iterations must be >= 1")
        if not 0 < cfg.num_elites <= cfg.num_samples:
            raise ValueError("need 0 < num_elites <= num_samples")
        if cfg.num_pi_trajs >= cfg.num_samples:
            raise ValueError("num_pi_trajs must be smaller than num_samples")
        self.next_fn, self.reward_fn, self.value_fn, self.pi_fn = next_fn, reward_fn, value_fn, pi_fn
        self.action_dim, self.discount, self.cfg, self.num_q = action_dim, discount, cfg, num_q

    @classmethod
    def from_world_model(cls, model, discount: float, cfg: Optional[MPPIConfig] = None) -> "MPPI":
        """Planner over a :class:`~ddprl.algos.tdmpc2.networks.WorldModel` (the unwrapped
        module: planning carries no gradient). Terminal value: Q 'avg' of 2 random members.
        ``cfg=None`` uses the defaults with ``mppi_iterations(model.action_dim)``."""
        if cfg is None:
            cfg = MPPIConfig(iterations=mppi_iterations(model.action_dim))
        return cls(next_fn=model.next,
                   reward_fn=lambda z, a: two_hot_inv(model.reward(z, a)),
                   value_fn=lambda z, a, members: model.Q(z, a, "avg", members=members),
                   pi_fn=lambda z, eps: model.policy(z, eps)[0],
                   action_dim=model.action_dim, discount=discount, cfg=cfg, num_q=model.num_q)

    def draw_noise(self, num_starts: int, like: Tensor, generator: Optional[torch.Generator] = None) -> PlanNoise:
        """The noise of one plan for ``num_starts`` latents, on ``like``'s device and dtype,
        from ``generator`` (None: the global RNG)."""
        c, A, E = self.cfg, self.action_dim, num_starts
        H, N, P, K, iters = c.horizon, c.num_samples, c.num_pi_trajs, c.num_elites, c.iterations

        def randn(*shape: int) -> Tensor:
            return torch.randn(shape, device=like.device, dtype=like.dtype, generator=generator)

        members = None
        if self.num_q is not None:  # 2 distinct members per iteration: argsort of uniforms
            uniform = torch.rand(iters, self.num_q, device=like.device, generator=generator)
            members = uniform.argsort(-1)[:, :2]
        return PlanNoise(samples=randn(iters, H, E, N - P, A), pi_prior=randn(H, E * P, A),
                         pi_terminal=randn(iters, E * N, A), members=members,
                         elite_u=torch.rand(E, K, device=like.device, dtype=like.dtype, generator=generator),
                         explore=randn(E, A))

    def _trajectory_value(self, z: Tensor, actions: Tensor, pi_eps: Tensor, members: Optional[Tensor]) -> Tensor:
        """V = sum_t gamma^t r_t + gamma^H Q(z_H, pi(z_H)). z (N, d), actions (H, N, A) -> (N, 1)."""
        value, gamma = 0.0, 1.0
        for t in range(actions.shape[0]):
            value = value + gamma * self.reward_fn(z, actions[t])
            z = self.next_fn(z, actions[t])
            gamma *= self.discount
        terminal_a = self.pi_fn(z, pi_eps) if self.pi_fn is not None else torch.zeros_like(actions[0])
        terminal = self.value_fn(z, terminal_a) if members is None else self.value_fn(z, terminal_a, members)
        return value + gamma * terminal

    @torch.no_grad()
    def plan(self, z0: Tensor, prev_mean: Optional[Tensor] = None, eval_mode: bool = False,
             generator: Optional[torch.Generator] = None, noise: Optional[PlanNoise] = None) -> Plan:
        """Plan from latents z0 (E, d); returns the action (E, A) to take now.

        ``prev_mean`` (H, E, A): the previous step's ``Plan.mean`` (None or zeros at an
        episode's first step); it is shifted one step forward to warm-start the sampling mean.
        ``eval_mode``: no exploration noise on the executed action. ``noise``: this plan's
        random numbers (:meth:`draw_noise`); None draws them from ``generator`` or the global RNG.
        """
        c, A = self.cfg, self.action_dim
        H, N, P, K = c.horizon, c.num_samples, c.num_pi_trajs, c.num_elites
        E = z0.shape[0]
        if noise is None:
            noise = self.draw_noise(E, z0, generator)
        # (E, N, d) -> flattened (E*N, d) rows for the callables
        z = z0.unsqueeze(1).expand(E, N, z0.shape[-1]).reshape(E * N, -1)

        prior = []
        if P > 0:  # policy-prior proposals: roll the prior through the dynamics
            zp = z0.unsqueeze(1).expand(E, P, z0.shape[-1]).reshape(E * P, -1)
            for t in range(H):
                a = self.pi_fn(zp, noise.pi_prior[t])
                prior.append(a.reshape(E, P, A))
                if t < H - 1:
                    zp = self.next_fn(zp, a)
        prior_actions = torch.stack(prior) if P > 0 else None  # (H, E, P, A)

        # warm start: last plan, one step later; new tail at 0
        mean = torch.zeros(H, E, A, device=z0.device, dtype=z0.dtype)
        if prev_mean is not None:
            mean = torch.cat([prev_mean[1:], mean[-1:]])
        std = torch.full((H, E, A), c.max_std, device=z0.device, dtype=z0.dtype)

        for i in range(c.iterations):
            sampled = (mean.unsqueeze(2) + std.unsqueeze(2) * noise.samples[i]).clamp(-1, 1)
            actions = sampled if prior_actions is None else torch.cat([prior_actions, sampled], 2)  # (H, E, N, A)
            members = None if noise.members is None else noise.members[i]
            value = self._trajectory_value(z, actions.reshape(H, E * N, A), noise.pi_terminal[i], members)
            value = torch.nan_to_num(value.reshape(E, N), nan=float("-inf"))  # a diverged rollout never wins
            elite_value, elite_idx = value.topk(K, dim=1)  # (E, K)
            elite_actions = actions.gather(2, elite_idx[None, :, :, None].expand(H, E, K, A))  # (H, E, K, A)
            # weights exp(temperature * (V - V_max)) normalised per start latent: (E, K)
            score = torch.exp(c.temperature * (elite_value - elite_value.max(1, keepdim=True).values))
            score = score / score.sum(1, keepdim=True)
            w = score[None, :, :, None]  # (1, E, K, 1)
            mean = (w * elite_actions).sum(2)  # (H, E, A)
            std = (w * (elite_actions - mean.unsqueeze(2)).pow(2)).sum(2).sqrt().clamp(c.min_std, c.max_std)

        # one elite drawn by weight (Gumbel-max: a categorical draw without a host sync)
        gumbel = -torch.log(-torch.log(noise.elite_u.clamp_min(1e-20)).clamp_min(1e-20))
        pick = (score.log() + gumbel).argmax(1)  # (E,)
        first = elite_actions[0].gather(1, pick[:, None, None].expand(E, 1, A)).squeeze(1)  # (E, A)
        if not eval_mode:
            first = first + std[0] * noise.explore
        return Plan(action=first.clamp(-1, 1), mean=mean, std=std)
