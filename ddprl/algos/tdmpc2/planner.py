"""MPPI planning in the latent space of a TD-MPC2 world model (Hansen, Wang, Su, ICLR 2024).

Settings from docs/references.md#mppi-planner: horizon 3, 6 iterations (+2 when the action dim
is >= 20), 512 samples, 64 elites, 24 trajectories from the policy prior, temperature 0.5,
std in [0.05, 2], warm start from the previous plan's mean shifted by one step.

The planner knows nothing of environments or of the model class: it takes four callables
(any module with ``next / reward / Q / pi`` works through :meth:`MPPI.from_world_model`).
It plans for E independent start latents at once (one per environment of this rank) and
keeps every step on the device: no ``.item()``, no host-side branching on tensor values
(the elite draw is a Gumbel-max, not ``torch.multinomial``).

One plan is three functions of tensors with static shapes, no host read and no branch on a
tensor's value: :meth:`MPPI.start` (the policy prior's trajectories, the warm-started mean),
:meth:`MPPI.iterate` (one iteration: sample, value, refit on the elites), called
``iterations`` times, and :meth:`MPPI.finish` (the executed elite and its exploration noise).
``torch.compile(fullgraph=True)`` captures each whole (``ddprl.algos.graphs``; a CUDA graph on
a GPU) and :meth:`plan` too. Compiled, the iteration is ONE graph replayed I times rather than
I unrolled copies: the graph compiler's time grows faster than the graph, and a replay costs
microseconds.

Randomness: every random number of a plan is one field of :class:`PlanNoise` (action
samples, policy-prior noise, the terminal Q members, the elite draw, exploration noise). Each
piece draws its share from the global RNG, which a compiled region turns into graph-safe
random kernels, or is given it, drawn by :meth:`MPPI.draw_noise` from a ``torch.Generator``:
then eager and compiled plans see the same numbers and choose the same action (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .math import two_hot_inv

Tensor = torch.Tensor


def mppi_iterations(action_dim: int, base: int = 6) -> int:
    """TD-MPC2: 6 MPPI iterations, 2 more for large action spaces (action_dim >= 20).

    >>> mppi_iterations(6), mppi_iterations(38)
    (6, 8)
    """
    return base + 2 if action_dim >= 20 else base


@dataclass(frozen=True)
class MPPIConfig:
    """MPPI hyper-parameters (TD-MPC2's defaults: docs/references.md#mppi-planner)."""

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
    members: Tensor | None  # (I, 2) Q members of the terminal value (None: value_fn takes none)
    elite_u: Tensor  # (E, K) U(0, 1): the Gumbel-max draw of the executed elite
    explore: Tensor  # (E, A) N(0, 1): exploration noise on the executed action


class PlanStart(NamedTuple):
    """What every iteration of one plan starts from (:meth:`MPPI.start`)."""

    z0: Tensor  # (E, d) start latents
    prior: Tensor | None  # (H, E, P, A) the policy prior's trajectories (None when P == 0)
    mean: Tensor  # (H, E, A) warm-started sampling mean
    std: Tensor  # (H, E, A) sampling std


class Elites(NamedTuple):
    """One iteration's result (:meth:`MPPI.iterate`): the refit distribution and its elites."""

    mean: Tensor  # (H, E, A)
    std: Tensor  # (H, E, A)
    score: Tensor  # (E, K) normalised elite weights
    actions: Tensor  # (H, E, K, A) elite trajectories


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

    def __init__(
        self,
        next_fn: Callable[[Tensor, Tensor], Tensor],
        reward_fn: Callable[[Tensor, Tensor], Tensor],
        value_fn: Callable[..., Tensor],
        pi_fn: Callable[[Tensor, Tensor], Tensor] | None,
        action_dim: int,
        discount: float,
        cfg: MPPIConfig = MPPIConfig(),
        num_q: int | None = None,
    ):
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
    def from_world_model(cls, model, discount: float, cfg: MPPIConfig | None = None) -> MPPI:
        """Planner over a :class:`~ddprl.algos.tdmpc2.networks.WorldModel` (the unwrapped
        module: planning carries no gradient). Terminal value: Q 'avg' of 2 random members.
        ``cfg=None`` uses the defaults with ``mppi_iterations(model.action_dim)``."""
        if cfg is None:
            cfg = MPPIConfig(iterations=mppi_iterations(model.action_dim))
        return cls(
            next_fn=model.next,
            reward_fn=lambda z, a: two_hot_inv(model.reward(z, a)),
            value_fn=lambda z, a, members: model.Q(z, a, "avg", members=members),
            pi_fn=lambda z, eps: model.policy(z, eps)[0],
            action_dim=model.action_dim,
            discount=discount,
            cfg=cfg,
            num_q=model.num_q,
        )

    def draw_noise(self, num_starts: int, like: Tensor, generator: torch.Generator | None = None) -> PlanNoise:
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
        return PlanNoise(
            samples=randn(iters, H, E, N - P, A),
            pi_prior=randn(H, E * P, A),
            pi_terminal=randn(iters, E * N, A),
            members=members,
            elite_u=torch.rand(E, K, device=like.device, dtype=like.dtype, generator=generator),
            explore=randn(E, A),
        )

    def _trajectory_value(self, z: Tensor, actions: Tensor, pi_eps: Tensor, members: Tensor | None) -> Tensor:
        """V = sum_t gamma^t r_t + gamma^H Q(z_H, pi(z_H)). z (N, d), actions (H, N, A) -> (N, 1)."""
        value, gamma = 0.0, 1.0
        for t in range(actions.shape[0]):
            value = value + gamma * self.reward_fn(z, actions[t])
            z = self.next_fn(z, actions[t])
            gamma *= self.discount
        terminal_a = self.pi_fn(z, pi_eps) if self.pi_fn is not None else torch.zeros_like(actions[0])
        terminal = self.value_fn(z, terminal_a) if members is None else self.value_fn(z, terminal_a, members)
        return value + gamma * terminal

    def plan(
        self,
        z0: Tensor,
        prev_mean: Tensor | None = None,
        eval_mode: bool = False,
        generator: torch.Generator | None = None,
        noise: PlanNoise | None = None,
    ) -> Plan:
        """Plan from latents z0 (E, d); returns the action (E, A) to take now.

        ``prev_mean`` (H, E, A): the previous step's ``Plan.mean`` (None or zeros at an
        episode's first step); it is shifted one step forward to warm-start the sampling mean.
        ``eval_mode``: no exploration noise on the executed action. ``noise``: this plan's
        random numbers (:meth:`draw_noise`); None draws them from ``generator``, or each piece
        from the global RNG.
        """
        if noise is None and generator is not None:
            noise = self.draw_noise(z0.shape[0], z0, generator)
        return self.refine(self.start(z0, prev_mean, None if noise is None else noise.pi_prior), eval_mode, noise)

    def refine(
        self,
        start: PlanStart,
        eval_mode: bool,
        noise: PlanNoise | None = None,
        iterate: Callable[..., Elites] | None = None,
        finish: Callable[..., Tensor] | None = None,
    ) -> Plan:
        """The iterations and the final draw after :meth:`start`. ``iterate`` / ``finish``:
        these methods (None) or the same compiled (``Acting``): I calls of ONE graph."""
        iterate, finish = iterate or self.iterate, finish or self.finish
        mean, std = start.mean, start.std
        for i in range(self.cfg.iterations):
            drawn = (
                (None, None, None)
                if noise is None
                else (noise.samples[i], noise.pi_terminal[i], None if noise.members is None else noise.members[i])
            )
            elites = iterate(start.z0, start.prior, mean, std, *drawn)
            mean, std = elites.mean, elites.std
        action = finish(elites, eval_mode, *((None, None) if noise is None else (noise.elite_u, noise.explore)))
        return Plan(action=action, mean=mean, std=std)

    @torch.no_grad()
    def start(self, z0: Tensor, prev_mean: Tensor | None = None, pi_prior: Tensor | None = None) -> PlanStart:
        """Before the first iteration: the policy prior's trajectories and the warm-started
        sampling mean and std. z0 (E, d); ``pi_prior`` (H, E*P, A) noise (None: global RNG)."""
        c, A = self.cfg, self.action_dim
        H, P, E = c.horizon, c.num_pi_trajs, z0.shape[0]
        prior = None
        if P > 0:  # policy-prior proposals: roll the prior through the dynamics
            if pi_prior is None:
                pi_prior = torch.randn(H, E * P, A, device=z0.device, dtype=z0.dtype)
            zp = z0.unsqueeze(1).expand(E, P, z0.shape[-1]).reshape(E * P, -1)
            actions = []
            for t in range(H):
                a = self.pi_fn(zp, pi_prior[t])
                actions.append(a.reshape(E, P, A))
                if t < H - 1:
                    zp = self.next_fn(zp, a)
            prior = torch.stack(actions)  # (H, E, P, A)

        # warm start: last plan, one step later; new tail at 0
        mean = torch.zeros(H, E, A, device=z0.device, dtype=z0.dtype)
        if prev_mean is not None:
            mean = torch.cat([prev_mean[1:], mean[-1:]])
        std = torch.full((H, E, A), c.max_std, device=z0.device, dtype=z0.dtype)
        return PlanStart(z0, prior, mean, std)

    @torch.no_grad()
    def iterate(
        self,
        z0: Tensor,
        prior: Tensor | None,
        mean: Tensor,
        std: Tensor,
        samples: Tensor | None = None,
        pi_terminal: Tensor | None = None,
        members: Tensor | None = None,
    ) -> Elites:
        """One MPPI iteration: sample around (mean, std), value every trajectory, refit on the
        elites. Noise (None: global RNG): samples (H, E, N-P, A), pi_terminal (E*N, A),
        members (2,) Q members of the terminal value."""
        c, A = self.cfg, self.action_dim
        H, N, P, K, E = c.horizon, c.num_samples, c.num_pi_trajs, c.num_elites, z0.shape[0]
        if samples is None:
            samples = torch.randn(H, E, N - P, A, device=z0.device, dtype=z0.dtype)
        if pi_terminal is None:
            pi_terminal = torch.randn(E * N, A, device=z0.device, dtype=z0.dtype)
        if members is None and self.num_q is not None:  # 2 distinct members: argsort of uniforms
            members = torch.rand(self.num_q, device=z0.device).argsort()[:2]
        z = z0.unsqueeze(1).expand(E, N, z0.shape[-1]).reshape(E * N, -1)  # one row per trajectory
        sampled = (mean.unsqueeze(2) + std.unsqueeze(2) * samples).clamp(-1, 1)
        actions = sampled if prior is None else torch.cat([prior, sampled], 2)  # (H, E, N, A)
        value = self._trajectory_value(z, actions.reshape(H, E * N, A), pi_terminal, members)
        value = torch.nan_to_num(value.reshape(E, N), nan=float("-inf"))  # a diverged rollout never wins
        elite_value, elite_idx = value.topk(K, dim=1)  # (E, K)
        elite_actions = actions.gather(2, elite_idx[None, :, :, None].expand(H, E, K, A))  # (H, E, K, A)
        # weights exp(temperature * (V - V_max)) normalised per start latent: (E, K)
        score = torch.exp(c.temperature * (elite_value - elite_value.max(1, keepdim=True).values))
        score = score / score.sum(1, keepdim=True)
        w = score[None, :, :, None]  # (1, E, K, 1)
        mean = (w * elite_actions).sum(2)  # (H, E, A)
        std = (w * (elite_actions - mean.unsqueeze(2)).pow(2)).sum(2).sqrt().clamp(c.min_std, c.max_std)
        return Elites(mean, std, score, elite_actions)

    @torch.no_grad()
    def finish(
        self, elites: Elites, eval_mode: bool, elite_u: Tensor | None = None, explore: Tensor | None = None
    ) -> Tensor:
        """The action to take: one elite of the last iteration drawn by weight, its first step,
        plus exploration noise unless ``eval_mode``. elite_u (E, K) U(0, 1), explore (E, A) N(0, 1)."""
        E, K, A = elites.score.shape[0], self.cfg.num_elites, self.action_dim
        if elite_u is None:
            elite_u = torch.rand(E, K, device=elites.score.device, dtype=elites.score.dtype)
        # Gumbel-max: a categorical draw without a host sync
        gumbel = -torch.log(-torch.log(elite_u.clamp_min(1e-20)).clamp_min(1e-20))
        pick = (elites.score.log() + gumbel).argmax(1)  # (E,)
        first = elites.actions[0].gather(1, pick[:, None, None].expand(E, 1, A)).squeeze(1)  # (E, A)
        if not eval_mode:
            if explore is None:
                explore = torch.randn_like(first)
            first = first + elites.std[0] * explore
        return first.clamp(-1, 1)
