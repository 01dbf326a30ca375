"""The multi-robot warehouse (rware 2.x) as a :class:`~ddprl.envs.marl.pyloop.OneEnv`.

RWARE never reaches a terminal state: its ``done`` comes from the step limit (``max_steps``,
500 in the registered ids) or, when set, ``max_inactivity_steps``. Both are truncation here.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import rware  # noqa: F401  (registers the rware-* ids)
from rware.warehouse import ObservationType, Warehouse

from ddprl.envs.marl.pyloop import Step, constructor_kwargs, grid_frame
from ddprl.errors import UsageError


class RwareEnv:
    """One warehouse. kwargs: ``time_limit`` (alias of ``max_steps``) and any ``Warehouse``
    constructor argument (overriding the id's registered value, e.g. ``column_height=4``),
    except message bits (a MultiDiscrete action) and dict observations.
    """

    extra_info_keys: tuple[str, ...] = ()

    def __init__(self, task: str, **kwargs: Any):
        kwargs = constructor_kwargs(task, kwargs, Warehouse.__init__, "max_steps", reserved=("render_mode",))
        if kwargs.get("msg_bits", 0):
            raise UsageError(f"{task}: msg_bits > 0 makes a MultiDiscrete action; only msg_bits=0 is supported")
        if kwargs.get("observation_type") in (ObservationType.DICT, ObservationType.IMAGE_DICT):
            raise UsageError(f"{task}: dict observations are not supported; use FLATTENED or IMAGE")
        self.env = Warehouse(**{**gym.spec(task).kwargs, **kwargs})  # as LBF: no gym.make wrappers
        self.n_agents = self.env.n_agents
        self.n_actions = int(self.env.action_space[0].n)
        self.obs_dim = int(np.prod(self.env.observation_space[0].shape))
        self.state_dim = self.n_agents * self.obs_dim
        self.episode_limit = int(self.env.max_steps)
        self._avail = np.ones((self.n_agents, self.n_actions), dtype=bool)  # as EPyMARL

    def _step(self, nobs: tuple[np.ndarray, ...]) -> Step:
        obs = np.concatenate(nobs, dtype=np.float32).reshape(self.n_agents, -1)
        return obs, obs.reshape(-1), self._avail

    def reset(self, seed: int | None) -> Step:
        nobs, _ = self.env.reset(seed=seed)
        return self._step(nobs)

    def step(self, actions: np.ndarray) -> tuple[Step, float, bool, bool]:
        nobs, rewards, done, _, _ = self.env.step(actions.tolist())
        return self._step(nobs), float(sum(rewards)), False, bool(done)

    def episode_extras(self) -> dict[str, float]:
        return {}

    def render_rgb(self) -> np.ndarray:
        """Aisles white, shelf bays grey, goals dark; shelves purple (requested: teal);
        agents orange discs (red when loaded) with a dot on the side they face."""
        env = self.env
        background = np.where(env.highways[..., None] > 0, 250, 215).astype(np.uint8).repeat(3, -1)
        for x, y in env.goals:  # rware keeps goals as (x, y)
            background[y, x] = (60, 60, 60)
        requested = {id(s) for s in env.request_queue}
        shelves = [(s.y, s.x, (0, 160, 160) if id(s) in requested else (120, 70, 150)) for s in env.shelfs]
        agents = [(a.y, a.x, (210, 40, 40) if a.carrying_shelf else (240, 140, 20), a.dir.value) for a in env.agents]
        return grid_frame(background, shelves, agents)

    def close(self) -> None:
        self.env.close()
