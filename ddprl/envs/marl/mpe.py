"""The multi-agent particle envs of mpe2 (parallel API) as a :class:`~ddprl.envs.marl.pyloop.OneEnv`.

Agents may differ in observation size and action count (``simple_speaker_listener_v4``: a
speaker observing 3 numbers with 3 actions, a listener observing 11 with 5). Every agent gets
the largest size here: observations are zero-padded, the extra actions are unavailable.

Team reward is the sum of the agents' rewards (EPyMARL). In the competitive scenarios
(``simple_adversary``, ``simple_tag``, ``simple_world_comm``, ``simple_crypto``, ``simple_push``)
that sum mixes the two sides; they are reachable for completeness, not for cooperative training.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ddprl.envs.marl.pyloop import Step, constructor_kwargs


def mpe_task_names() -> list[str]:
    from mpe2.all_modules import mpe_environments

    return sorted(name.removeprefix("mpe/") for name in mpe_environments)


class MPEEnv:
    """One particle world with discrete actions. kwargs: ``time_limit`` (alias of ``max_cycles``,
    default 25) and the scenario's own (``N``, ``local_ratio``, ``terminate_on_success``, ...).
    """

    extra_info_keys: tuple[str, ...] = ()

    def __init__(self, task: str, **kwargs: Any):
        module = importlib.import_module(f"mpe2.{task.removeprefix('mpe/')}")
        kwargs = constructor_kwargs(
            task, kwargs, module.raw_env.__init__, "max_cycles", reserved=("continuous_actions", "render_mode")
        )
        # rgb_array only matters for render(): the pygame surface exists in every mode.
        self.env = module.parallel_env(continuous_actions=False, render_mode="rgb_array", **kwargs)
        self.raw = self.env.unwrapped
        self.agents = list(self.env.possible_agents)
        obs_sizes = [self.env.observation_space(a).shape[0] for a in self.agents]
        act_sizes = [int(self.env.action_space(a).n) for a in self.agents]
        self.n_agents = len(self.agents)
        self.obs_dim, self.n_actions = max(obs_sizes), max(act_sizes)
        self.state_dim = int(self.raw.state_space.shape[0])
        self.episode_limit = int(self.raw.max_cycles)
        self._avail = np.arange(self.n_actions) < np.array(act_sizes)[:, None]  # (A, U)

    def _step(self, obs_by_agent: dict[str, np.ndarray]) -> Step:
        obs = np.zeros((self.n_agents, self.obs_dim), dtype=np.float32)
        for i, agent in enumerate(self.agents):
            o = obs_by_agent[agent]
            obs[i, : o.shape[0]] = o
        return obs, self.env.state().astype(np.float32, copy=False), self._avail

    def reset(self, seed: int | None) -> Step:
        obs, _ = self.env.reset(seed=seed)
        return self._step(obs)

    def step(self, actions: np.ndarray) -> tuple[Step, float, bool, bool]:
        obs, rewards, terminations, truncations, _ = self.env.step(
            dict(zip(self.agents, actions.tolist(), strict=True))
        )
        terminated = any(terminations.values())
        truncated = any(truncations.values()) and not terminated
        # mpe2 checks its step limit before success: success on the last step is still success.
        if truncated and self.raw.scenario.is_terminal(self.raw.world):
            terminated, truncated = True, False
        return self._step(obs), float(sum(rewards.values())), terminated, truncated

    def episode_extras(self) -> dict[str, float]:
        return {}

    def render_rgb(self) -> np.ndarray:
        return self.env.render()

    def close(self) -> None:
        # Not mpe2's close(): it calls pygame.quit(), which breaks rendering in every other
        # MPE env of the process. The surface goes with the env.
        pass
