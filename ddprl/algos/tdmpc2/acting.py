"""TD-MPC2 on one rank's environments: the env it needs, recording episodes, choosing actions.

- the env it needs is :func:`ddprl.algos.tdmpc2.env.make_tdmpc2_env`: any ``make_env`` task with a
  continuous 1-D action box and flat observations, actions presented to the agent in [-1, 1].
- :class:`EpisodeRecorder`: keeps each env's transitions until its episode ends, then hands
  the whole episode to the replay buffer (as in TD-MPC2: episodes enter the buffer when they end).
- :class:`Acting`: MPPI warm-started from each env's previous plan, or the policy prior
  alone (``mpc=false``); :class:`NotifyEpisodeEnds` tells it when an eval env's episode ends.
Nothing here is distributed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ddprl.algos.graphs import compile_region, keep, step_begin
from ddprl.algos.tdmpc2.env import EnvWrapper
from ddprl.algos.tdmpc2.networks import WorldModel
from ddprl.algos.tdmpc2.planner import MPPI, MPPIConfig, PlanNoise, PlanStart, mppi_iterations

if TYPE_CHECKING:
    from ddprl.algos.tdmpc2.config import TDMPC2Config


class Episode(NamedTuple):
    """One finished episode of T transitions (CPU tensors, the buffer's ``add_episode`` order)."""

    obs: torch.Tensor  # (T+1, obs_dim), the last one the true final observation
    actions: torch.Tensor  # (T, A)
    rewards: torch.Tensor  # (T,)
    terminated: torch.Tensor  # (T,) bool, True at most on the last transition


class EpisodeRecorder:
    """Per-env transition lists, handed over whole when the env's episode ends.

    >>> rec = EpisodeRecorder(num_envs=1)
    >>> rec.start(torch.zeros(1, 3))
    >>> done = rec.add(torch.zeros(1, 2), torch.ones(1), torch.tensor([True]), torch.tensor([True]),
    ...                final_obs=torch.ones(1, 3), next_obs=torch.zeros(1, 3))
    >>> done[0].obs.shape, done[0].terminated
    (torch.Size([2, 3]), tensor([True]))
    """

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self._obs: list[list[torch.Tensor]] = [[] for _ in range(num_envs)]
        self._act: list[list[torch.Tensor]] = [[] for _ in range(num_envs)]
        self._rew: list[list[torch.Tensor]] = [[] for _ in range(num_envs)]
        self._term: list[list[torch.Tensor]] = [[] for _ in range(num_envs)]

    def start(self, obs: torch.Tensor) -> None:
        """First observations (N, obs_dim) of fresh episodes (after a reset)."""
        obs = obs.detach().cpu()
        for i in range(self.num_envs):
            self._obs[i], self._act[i], self._rew[i], self._term[i] = [obs[i]], [], [], []

    def add(
        self,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
        done: torch.Tensor,
        final_obs: torch.Tensor,
        next_obs: torch.Tensor,
    ) -> list[Episode]:
        """Record one step of every env (N rows each); return the episodes that just ended."""
        actions, rewards, terminated = actions.detach().cpu(), rewards.detach().cpu(), terminated.cpu()
        final_obs, next_obs, done = final_obs.detach().cpu(), next_obs.detach().cpu(), done.cpu()
        finished = []
        for i in range(self.num_envs):
            self._act[i].append(actions[i])
            self._rew[i].append(rewards[i])
            self._term[i].append(terminated[i])
            if done[i]:
                finished.append(
                    Episode(
                        torch.stack(self._obs[i] + [final_obs[i]]),
                        torch.stack(self._act[i]),
                        torch.stack(self._rew[i]),
                        torch.stack(self._term[i]),
                    )
                )
                self._obs[i], self._act[i], self._rew[i], self._term[i] = [next_obs[i]], [], [], []
            else:
                self._obs[i].append(next_obs[i])
        return finished


def mppi_config(cfg: TDMPC2Config, action_dim: int) -> MPPIConfig:
    """The planner settings of ``cfg`` (iterations null -> 6, or 8 for action_dim >= 20)."""
    iterations = cfg.iterations if cfg.iterations is not None else mppi_iterations(action_dim)
    return MPPIConfig(
        horizon=cfg.horizon,
        iterations=iterations,
        num_samples=cfg.num_samples,
        num_elites=cfg.num_elites,
        num_pi_trajs=cfg.num_pi_trajs,
        temperature=cfg.temperature,
        min_std=cfg.min_std,
        max_std=cfg.max_std,
    )


class Acting:
    """Actions for one batch of E envs from the (unwrapped) world model, without gradients.

    ``mpc=true``: MPPI, warm-started from each env's previous plan shifted one step
    (docs/references.md#mppi-planner); call :meth:`episode_ended` with the done mask after every env step so a
    new episode starts from a blank plan. ``mpc=false``: the policy prior (its mean in eval).
    The model is switched to eval mode (no Q dropout) while acting.

    ``compile=True``: the act runs as compiled regions (``ddprl.algos.graphs``; CUDA graphs
    on a GPU): encode + :meth:`MPPI.start` one, :meth:`MPPI.iterate` one (replayed for every
    iteration), :meth:`MPPI.finish` one; the policy prior alone (``mpc=false``) one. Outputs
    are copied before the next call can overwrite them; the warm-start mean is always a
    tensor (zeros for a new episode), so the same graphs serve every step.
    """

    def __init__(self, model: WorldModel, cfg: TDMPC2Config, discount: float, compile: bool = False):
        self.model = model
        self.planner = None
        if cfg.mpc:
            self.planner = MPPI.from_world_model(model, discount, mppi_config(cfg, model.action_dim))
        self.horizon = cfg.horizon
        self.prev_mean: torch.Tensor | None = None  # (H, E, A) last plan's mean
        self.device = next(model.parameters()).device

        def region(fn, name):
            return compile_region(fn, self.device, name=f"tdmpc2 act {name}") if compile else fn

        if self.planner is None:
            self._prior = region(self.prior_fn, "prior")
        else:
            self._start, self._iterate, self._finish = (
                region(self.start_fn, "start"),
                region(self.planner.iterate, "iterate"),
                region(self.planner.finish, "finish"),
            )

    def episode_ended(self, done: torch.Tensor) -> None:
        """Forget the plan of envs whose episode just ended: done (E,) bool."""
        if self.prev_mean is not None:
            # zero mean == no warm start for those envs; a mask, not a branch: no host sync
            keep_mean = (~done.to(self.prev_mean.device)).to(self.prev_mean.dtype)
            self.prev_mean = self.prev_mean * keep_mean[None, :, None]

    def start_fn(self, obs: torch.Tensor, prev_mean: torch.Tensor, pi_prior: torch.Tensor | None) -> PlanStart:
        """Region: obs (E, obs_dim), prev_mean (H, E, A) -> where the plan's iterations start."""
        return self.planner.start(self.model.encode(obs), prev_mean, pi_prior)

    def prior_fn(
        self, obs: torch.Tensor, prev_mean: torch.Tensor, eval_mode: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Region (``mpc=false``): the policy prior's action (its mean in eval), prev_mean as is."""
        action, info = self.model.pi(self.model.encode(obs))
        return (info["mean"] if eval_mode else action), prev_mean

    def act_fn(
        self, obs: torch.Tensor, prev_mean: torch.Tensor, eval_mode: bool, noise: PlanNoise | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One act: obs (E, obs_dim), prev_mean (H, E, A) -> action (E, A), plan mean (H, E, A)."""
        if self.planner is None:
            return self._prior(obs, prev_mean, eval_mode)
        start = self._start(obs, prev_mean, None if noise is None else noise.pi_prior)
        plan = self.planner.refine(start, eval_mode, noise, self._iterate, self._finish)
        return plan.action, plan.mean

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, eval_mode: bool = False, noise: PlanNoise | None = None) -> torch.Tensor:
        """obs (E, obs_dim) -> actions (E, A) in [-1, 1]; exploration noise unless ``eval_mode``.
        ``noise``: the plan's random numbers (``planner.draw_noise``); None: the global RNG."""
        self.model.eval()
        E = obs.shape[0]
        if self.prev_mean is None or self.prev_mean.shape[1] != E:
            self.prev_mean = torch.zeros(self.horizon, E, self.model.action_dim, device=obs.device, dtype=obs.dtype)
        step_begin(self.device)
        action, self.prev_mean = keep(self.act_fn(obs, self.prev_mean, eval_mode, noise))
        return action


class NotifyEpisodeEnds(EnvWrapper):
    """Tell an :class:`Acting` which episodes ended at each step (eval and video envs)."""

    def __init__(self, env: Any, acting: Acting):
        super().__init__(env)
        self.acting = acting

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self.acting.prev_mean = None
        return self.env.reset(seed=seed)

    def step(self, actions: torch.Tensor):
        out = self.env.step(actions)
        self.acting.episode_ended(out[2] | out[3])
        return out
