"""Level-Based Foraging (lbforaging 2.x) as a :class:`~ddprl.envs.marl.pyloop.OneEnv`.

Two things differ from what LBF reports itself:

- LBF ends an episode with ``done=True`` both when all food is eaten and at its step limit
  (``max_episode_steps``, 50 in the registered ids). Here an episode that ends with food left
  on the field is *truncated*; all food eaten is *terminated*, even on the last step.
- lbforaging registers 1 to 4 food; the 5-food layouts of the EPyMARL benchmark
  (Papoudakis et al., 2021), e.g. ``Foraging-15x15-4p-5f-v3``, are registered here with the
  same id pattern and kwargs, for 5 to 9 food.
"""

from __future__ import annotations

from itertools import product
from typing import Any

import gymnasium as gym
import lbforaging  # noqa: F401  (registers the Foraging-* ids)
import numpy as np
from lbforaging.foraging.environment import ForagingEnv

from ddprl.envs.marl.pyloop import Step, constructor_kwargs, grid_frame, shade


def register_more_food(foods: range = range(5, 10)) -> None:
    """Register ``Foraging-*`` ids for ``foods`` food as lbforaging's own loop does for 1..4."""
    for size, players, food, coop, partial in product(range(5, 20), range(2, 10), foods, (True, False), (True, False)):
        task = f"Foraging{'-2s' if partial else ''}-{size}x{size}-{players}p-{food}f{'-coop' if coop else ''}-v3"
        if task in gym.registry:
            continue
        gym.register(
            task,
            entry_point="lbforaging.foraging:ForagingEnv",
            kwargs={
                "players": players,
                "min_player_level": 1,
                "max_player_level": 2,
                "field_size": (size, size),
                "min_food_level": 1,
                "max_food_level": None,
                "max_num_food": food,
                "sight": 2 if partial else size,
                "max_episode_steps": 50,
                "force_coop": coop,
                "grid_observation": False,
                "penalty": 0.0,
            },
        )


register_more_food()


class LBFEnv:
    """One LBF game. kwargs: ``time_limit`` (alias of ``max_episode_steps``), ``action_masks``
    (False: every action available, as EPyMARL's gymma wrapper; True: LBF's own valid actions,
    e.g. LOAD only next to food), and any ``ForagingEnv`` constructor argument (overriding the
    id's registered value, e.g. ``penalty=0.1``).
    """

    extra_info_keys = ("success",)

    def __init__(self, task: str, action_masks: bool = False, **kwargs: Any):
        kwargs = constructor_kwargs(task, kwargs, ForagingEnv.__init__, "max_episode_steps", reserved=("render_mode",))
        # The class itself, not gym.make: gym.make would take max_episode_steps for its own
        # TimeLimit wrapper, and its checker and order wrappers cost more than LBF's step.
        self.env = ForagingEnv(**{**gym.spec(task).kwargs, **kwargs})
        self.action_masks = action_masks
        self.n_agents = self.env.n_agents
        self.n_actions = int(self.env.action_space[0].n)
        self.obs_dim = int(np.prod(self.env.observation_space[0].shape))
        self.state_dim = self.n_agents * self.obs_dim
        self.episode_limit = int(self.env._max_episode_steps)
        self._all_available = np.ones((self.n_agents, self.n_actions), dtype=bool)

    def _step(self, nobs: tuple[np.ndarray, ...]) -> Step:
        obs = np.concatenate(nobs, dtype=np.float32).reshape(self.n_agents, -1)
        if not self.action_masks:
            avail = self._all_available
        else:  # the sets LBF itself uses to turn invalid actions into NONE
            avail = np.zeros((self.n_agents, self.n_actions), dtype=bool)
            for i, player in enumerate(self.env.players):
                avail[i, [a.value for a in self.env._valid_actions[player]]] = True
        return obs, obs.reshape(-1), avail  # state: the agents' observations, as EPyMARL

    def reset(self, seed: int | None) -> Step:
        nobs, _ = self.env.reset(seed=seed)
        return self._step(nobs)

    def step(self, actions: np.ndarray) -> tuple[Step, float, bool, bool]:
        nobs, rewards, done, _, _ = self.env.step(actions.tolist())
        terminated = bool(done) and self._all_eaten()
        return self._step(nobs), float(sum(rewards)), terminated, bool(done) and not terminated

    def _all_eaten(self) -> bool:
        return not self.env.field.any()

    def episode_extras(self) -> dict[str, float]:
        return {"success": float(self._all_eaten())}

    def render_rgb(self) -> np.ndarray:
        """Food as green squares, agents as blue discs; darker = higher level."""
        env = self.env
        background = np.full((*env.field.shape, 3), 245, dtype=np.uint8)
        top_food = max(env.field.max(), 1)
        food = [
            (r, c, shade((40, 160, 40), env.field[r, c], top_food)) for r, c in zip(*np.nonzero(env.field), strict=True)
        ]
        top_level = max(p.level for p in env.players)
        agents = [(*p.position, shade((30, 60, 200), p.level, top_level)) for p in env.players]
        return grid_frame(background, food, agents)

    def close(self) -> None:
        self.env.close()
