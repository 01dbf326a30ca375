"""DeepMind Control Suite tasks behind ddprl's torch ``VecEnv`` contract (see ``envs/base.py``).

Task names are ``<domain>-<task>`` as in TD-MPC2: ``walker-run``, ``dog-run``,
``humanoid_CMU-walk``, ``cartpole-swingup_sparse``; the aliases ``cup`` (``ball_in_cup``)
and ``pointmass`` (``point_mass``) are accepted, as TD-MPC2 names them (docs/tdmpc2.md,
"Quick start"). The protocol:

- observation: every entry of the task's observation dict, flattened and concatenated in
  the dict's order, float32;
- action repeat 2: one agent step is two simulator steps, rewards summed;
- 500 agent steps per episode (1,000 simulator steps), ended as *truncated* (the time limit
  is not part of the MDP: the agent bootstraps through it). A task that ends an episode
  itself with discount 0 (a real terminal state) reports *terminated*;
- actions in [-1, 1], mapped linearly onto the task's bounds where those differ (quadruped's
  upper bound is 1.1). Bounds wider than 1e6 (``lqr``) count as unbounded: passed through.

dm_control is imported lazily, so ``ddprl`` itself runs without it; :func:`check_dmc_installed`
turns a missing or broken install into a :class:`~ddprl.errors.UsageError`.

    >>> env = DMCVecEnv("cartpole-balance", num_envs=2, seed=1)      # doctest: +SKIP
    >>> env.reset().shape, env.single_action_space.shape              # doctest: +SKIP
    (torch.Size([2, 5]), (1,))
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ddprl.errors import UsageError

ACTION_REPEAT = 2
EPISODE_LENGTH = 500  # agent steps; x ACTION_REPEAT = the suite's 1,000 simulator steps

DOMAIN_ALIASES = {"cup": "ball_in_cup", "pointmass": "point_mass"}

# dm_control 1.0.50's ``suite.ALL_TASKS``, kept here so that ``check_task`` recognises a DMC
# name without importing dm_control (and can then say "install it" instead of "unknown task").
# tests/test_dmc.py checks this list against the installed suite.
DMC_TASKS: frozenset[tuple[str, str]] = frozenset(
    {
        ("acrobot", "swingup"),
        ("acrobot", "swingup_sparse"),
        ("ball_in_cup", "catch"),
        ("cartpole", "balance"),
        ("cartpole", "balance_sparse"),
        ("cartpole", "swingup"),
        ("cartpole", "swingup_sparse"),
        ("cartpole", "three_poles"),
        ("cartpole", "two_poles"),
        ("cheetah", "run"),
        ("dog", "fetch"),
        ("dog", "run"),
        ("dog", "stand"),
        ("dog", "trot"),
        ("dog", "walk"),
        ("finger", "spin"),
        ("finger", "turn_easy"),
        ("finger", "turn_hard"),
        ("fish", "swim"),
        ("fish", "upright"),
        ("hopper", "hop"),
        ("hopper", "stand"),
        ("humanoid", "run"),
        ("humanoid", "run_pure_state"),
        ("humanoid", "stand"),
        ("humanoid", "walk"),
        ("humanoid_CMU", "run"),
        ("humanoid_CMU", "stand"),
        ("humanoid_CMU", "walk"),
        ("lqr", "lqr_2_1"),
        ("lqr", "lqr_6_2"),
        ("manipulator", "bring_ball"),
        ("manipulator", "bring_peg"),
        ("manipulator", "insert_ball"),
        ("manipulator", "insert_peg"),
        ("pendulum", "swingup"),
        ("point_mass", "easy"),
        ("point_mass", "hard"),
        ("quadruped", "escape"),
        ("quadruped", "fetch"),
        ("quadruped", "run"),
        ("quadruped", "walk"),
        ("reacher", "easy"),
        ("reacher", "hard"),
        ("stacker", "stack_2"),
        ("stacker", "stack_4"),
        ("swimmer", "swimmer15"),
        ("swimmer", "swimmer6"),
        ("walker", "run"),
        ("walker", "stand"),
        ("walker", "walk"),
    }
)
DMC_DOMAINS = frozenset(d for d, _ in DMC_TASKS)


def parse_dmc_task(name: str) -> tuple[str, str] | None:
    """``'cup-catch'`` -> ``('ball_in_cup', 'catch')``; None when ``name`` is no DMC task.

    Domains and tasks may hold underscores but never a dash, so the first dash splits them.

    >>> parse_dmc_task("pointmass-easy"), parse_dmc_task("HalfCheetah-v5")
    (('point_mass', 'easy'), None)
    """
    domain, sep, task = name.partition("-")
    if not sep:
        return None
    domain = DOMAIN_ALIASES.get(domain, domain)
    return (domain, task) if (domain, task) in DMC_TASKS else None


def is_dmc_domain(name: str) -> bool:
    """True when ``name`` starts with a DMC domain (``walker-rnu`` is a misspelt DMC task)."""
    domain = name.partition("-")[0]
    return DOMAIN_ALIASES.get(domain, domain) in DMC_DOMAINS


def dmc_task_names() -> list[str]:
    """Every accepted ``domain-task`` name (aliases included), for near-match suggestions."""
    names = [f"{d}-{t}" for d, t in DMC_TASKS]
    names += [f"{alias}-{t}" for alias, d in DOMAIN_ALIASES.items() for dd, t in DMC_TASKS if dd == d]
    return sorted(names)


def check_dmc_installed() -> None:
    """Raise a UsageError saying what to install when dm_control cannot be used."""
    from ddprl.envs.mujoco_gl import import_mujoco

    try:
        mujoco = import_mujoco()
    except ImportError:
        raise UsageError(
            "DMC tasks need dm-control and mujoco: pip install 'ddprl[dmc]' (dm-control==1.0.50 mujoco==3.17.0)"
        ) from None
    if int(mujoco.__version__.split(".")[0]) >= 4:
        raise UsageError(
            f"mujoco {mujoco.__version__} does not work with dm-control 1.0.50: pip install mujoco==3.17.0"
        )
    try:
        from dm_control import suite  # noqa: F401
    except ImportError as e:
        raise UsageError(f"DMC tasks need dm-control: pip install 'ddprl[dmc]' ({e})") from None


class DMCVecEnv:
    """``num_envs`` copies of one DMC task stepping in this process, as torch tensors.

    Env ``i`` is seeded ``seed + i`` (pass ``seed=env_seed(cfg.seed, rank)``). ``reset(seed)``
    reseeds every task's random state, so a seed fixes the episodes that follow.
    ``episode_length`` (agent steps) and ``action_repeat`` may be changed for tests and
    experiments; the defaults are TD-MPC2's protocol.
    """

    def __init__(
        self,
        task: str,
        num_envs: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        episode_length: int = EPISODE_LENGTH,
        action_repeat: int = ACTION_REPEAT,
    ):
        parsed = parse_dmc_task(task)
        if parsed is None:
            raise UsageError(f"unknown DMC task {task!r}")
        if episode_length < 1 or action_repeat < 1:
            raise UsageError(f"episode_length={episode_length} and action_repeat={action_repeat} must be >= 1")
        check_dmc_installed()
        from dm_control import suite

        self.task, self.domain_task = task, parsed
        self.num_envs, self.device, self.seed = num_envs, torch.device(device), seed
        self.max_episode_steps, self.action_repeat = episode_length, action_repeat
        # time_limit=inf: the suite would end episodes after its own 1,000 simulator steps;
        # here the agent-step count decides, so a changed action repeat keeps 500 agent steps.
        self.envs = [
            suite.load(*parsed, task_kwargs={"random": seed + i, "time_limit": float("inf")}) for i in range(num_envs)
        ]
        spec = self.envs[0].action_spec()
        low, high = spec.minimum.astype(np.float64), spec.maximum.astype(np.float64)
        bounded = bool(np.all(np.abs(low) < 1e6) and np.all(np.abs(high) < 1e6))
        self._scale = ((high - low) / 2, (high + low) / 2) if bounded else None
        self._action_shape = spec.shape
        obs_dim = sum(int(np.prod(v.shape)) for v in self.envs[0].observation_spec().values())
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, spec.shape, np.float32)
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._obs = np.zeros((num_envs, obs_dim), dtype=np.float32)

    @staticmethod
    def _flat(observation: dict[str, Any]) -> np.ndarray:
        return np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1) for v in observation.values()])

    def _tensor(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype, device=self.device)  # a copy: the arrays are reused

    def _reset_one(self, i: int) -> np.ndarray:
        self._episode_return[i] = 0.0
        self._episode_length[i] = 0
        return self._flat(self.envs[i].reset().observation)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every env (reseeding env ``i`` with ``seed + i`` when a seed is given)."""
        for i, env in enumerate(self.envs):
            if seed is not None:
                env.task.random.seed(seed + i)
            self._obs[i] = self._reset_one(i)
        return self._tensor(self._obs)

    def step(self, actions: torch.Tensor):
        """One agent step (``action_repeat`` simulator steps) of every env; same-step autoreset."""
        act = np.clip(actions.detach().cpu().numpy().astype(np.float64), -1.0, 1.0).reshape(
            self.num_envs, *self._action_shape
        )
        if self._scale is not None:
            act = act * self._scale[0] + self._scale[1]
        reward = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        final_obs = np.empty_like(self._obs)
        for i, env in enumerate(self.envs):
            for _ in range(self.action_repeat):
                ts = env.step(act[i])
                reward[i] += ts.reward or 0.0
                if ts.last():  # the task ended the episode (time_limit is inf): a terminal state
                    terminated[i] = ts.discount == 0.0
                    truncated[i] = not terminated[i]
                    break
            final_obs[i] = self._flat(ts.observation)
            self._episode_length[i] += 1
            self._episode_return[i] += reward[i]
            if self._episode_length[i] >= self.max_episode_steps:
                truncated[i] = not terminated[i]
        done = terminated | truncated
        info = {
            "final_obs": self._tensor(final_obs),
            "episode_return": self._tensor(self._episode_return.astype(np.float32)),
            "episode_length": self._tensor(self._episode_length.copy(), torch.int64),
        }
        next_obs = final_obs
        for i in np.flatnonzero(done):
            next_obs[i] = self._reset_one(i)  # same-step autoreset: obs is the next episode's first
        self._obs = next_obs
        return (
            self._tensor(next_obs),
            self._tensor(reward),
            self._tensor(terminated, torch.bool),
            self._tensor(truncated, torch.bool),
            info,
        )

    def render_rgb(self, index: int = 0, height: int = 240, width: int = 320) -> np.ndarray:
        """(height, width, 3) uint8 frame of env ``index``; needs an OpenGL backend (MUJOCO_GL)."""
        camera = 2 if self.domain_task[0] == "quadruped" else 0  # the camera TD-MPC2's videos use
        try:
            return self.envs[index].physics.render(height, width, camera_id=camera)
        except Exception as e:  # no display, no EGL/OSMesa library, or MUJOCO_GL=disable
            from ddprl.envs.mujoco_gl import cannot_render, reason

            raise cannot_render(self.task, reason(e)) from None

    def state_dict(self) -> None:
        """No exact mid-episode resume for DMC: a resumed run starts fresh episodes."""
        return None

    def close(self) -> None:
        for env in self.envs:
            env.close()
