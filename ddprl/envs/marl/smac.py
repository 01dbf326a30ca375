"""StarCraft II micromanagement (SMAC: the oxwhirl ``smac`` package and the game itself) as a
:class:`~ddprl.envs.marl.pyloop.OneEnv`: ``task=sc2/<map>`` (``sc2/3m``, ``sc2/2s3z``, ...).

Neither the game nor its maps come from a package index: install StarCraft II and the SMAC
maps as SMAC's README says, and ``pip install git+https://github.com/oxwhirl/smac.git``. Without
them the task is refused in one line before any process starts (:func:`check_smac`).

What SMAC's ``StarCraft2Env`` gives and what this adapter makes of it:

- ``reset()`` / ``step(actions) -> reward, terminated, info``: one game per copy, launched on
  the first reset with the copy's seed (SMAC seeds a game when it launches it).
- terminated vs truncated: SMAC ends an episode at its map's limit with ``terminated=True``
  too; here a battle that ends with neither side dead is truncated (bootstrapped with
  ``bootstrap_truncated=true``), one that ends with a side dead terminated.
- the reward is SMAC's (the team's, scaled to 20 for a perfect battle by default);
  ``info["battle_won"]`` is ``episode_won``: ``eval/won_mean`` is the win rate.
- observations, the state and the available actions are ``get_obs()``, ``get_state()`` and
  ``get_avail_actions()``; kwargs go to ``StarCraft2Env`` (``difficulty``, ``reward_sparse``, ...).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from ddprl.envs.marl.pyloop import Step
from ddprl.errors import UsageError

INSTALL = "pip install git+https://github.com/oxwhirl/smac.git"
# where SMAC (through pysc2) looks for the game when SC2PATH is not set, on Linux
DEFAULT_SC2PATH = "~/StarCraftII"


def sc2_path() -> Path:
    return Path(os.environ.get("SC2PATH", DEFAULT_SC2PATH)).expanduser()


def check_smac() -> None:
    """One line saying what is missing when SMAC tasks cannot run here: the package or the game."""
    if importlib.util.find_spec("smac") is None:
        raise UsageError(f"sc2/ tasks need the smac package and StarCraft II: {INSTALL}")
    if not sc2_path().is_dir():
        raise UsageError(
            f"sc2/ tasks need StarCraft II with the SMAC maps; none at {sc2_path()} (set SC2PATH to where it is "
            "installed: https://github.com/oxwhirl/smac#installing-starcraft-ii)"
        )


def smac_task_names() -> list[str]:
    from smac.env.starcraft2.maps import smac_maps

    return [f"sc2/{name}" for name in sorted(smac_maps.get_smac_map_registry())]


class SMACEnv:
    """One StarCraft II battle of map ``task`` (``sc2/<map>``) through SMAC's ``StarCraft2Env``."""

    extra_info_keys: tuple[str, ...] = ("won",)

    def __init__(self, task: str, **kwargs: Any):
        from smac.env import StarCraft2Env

        for reserved in ("map_name", "seed"):
            if reserved in kwargs:
                raise UsageError(f"{task}: {reserved} is set by ddprl (the task's map, the run's seed)")
        if "time_limit" in kwargs:
            raise UsageError(f"{task}: SMAC's maps fix their episode limit; time_limit cannot change it")
        self.map_name, self.kwargs = task.removeprefix("sc2/"), kwargs
        self._make, self.env = StarCraft2Env, StarCraft2Env(map_name=self.map_name, **kwargs)
        info = self.env.get_env_info()
        self.n_agents, self.n_actions = int(info["n_agents"]), int(info["n_actions"])
        self.obs_dim, self.state_dim = int(info["obs_shape"]), int(info["state_shape"])
        self.episode_limit = int(info["episode_limit"])
        self._launched, self._won = False, False

    def _step(self) -> Step:
        env = self.env
        return (
            np.asarray(env.get_obs(), dtype=np.float32).reshape(self.n_agents, self.obs_dim),
            np.asarray(env.get_state(), dtype=np.float32).reshape(self.state_dim),
            np.asarray(env.get_avail_actions(), dtype=bool).reshape(self.n_agents, self.n_actions),
        )

    def reset(self, seed: int | None) -> Step:
        if seed is not None:
            if self._launched:  # a seed reaches the game only at its launch: start another
                self.env.close()
            self.env = self._make(map_name=self.map_name, seed=seed, **self.kwargs)
        self.env.reset()
        self._launched, self._won = True, False
        return self._step()

    def step(self, actions: np.ndarray) -> tuple[Step, float, bool, bool]:
        reward, ended, info = self.env.step([int(a) for a in actions])
        self._won = bool(info.get("battle_won", False))
        # SMAC says a time-limit end only with continuing_episode=True; a side wiped out says it too
        side_dead = self._won or bool(np.all(self.env.death_tracker_ally)) or bool(np.all(self.env.death_tracker_enemy))
        truncated = bool(ended) and (bool(info.get("episode_limit", False)) or not side_dead)
        return self._step(), float(reward), bool(ended) and not truncated, truncated

    def episode_extras(self) -> dict[str, float]:
        return {"won": float(self._won)}

    def render_rgb(self) -> np.ndarray:
        return self.env.render(mode="rgb_array")

    def close(self) -> None:
        self.env.close()
