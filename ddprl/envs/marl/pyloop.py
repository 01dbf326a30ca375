"""N copies of a one-process Python multi-agent env behind ``MultiAgentVecEnv`` (LBF, RWARE, MPE).

The copies step one after the other in this process: a subprocess per copy would add a pipe
round trip per step, as long as these envs' own step (0.1 to 0.5 ms), and each rank already
has its core. Each family supplies a :class:`OneEnv`, one copy reduced to numpy;
:class:`PyLoopVecEnv` does the rest once for all of them: auto-reset, episode statistics,
stacking into tensors on the device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from ddprl.envs.marl.base import MAObs
from ddprl.errors import UsageError

# obs (A, O) float32, state (S,) float32, avail (A, U) bool: one copy's view of one step
Step = tuple[np.ndarray, np.ndarray, np.ndarray]


class OneEnv(Protocol):
    """One copy of a CPU multi-agent env, in numpy. Sizes are those of ``MultiAgentVecEnv``."""

    n_agents: int
    n_actions: int
    obs_dim: int
    state_dim: int
    episode_limit: int
    extra_info_keys: tuple[str, ...]

    def reset(self, seed: int | None) -> Step:
        """Start an episode; ``seed=None`` continues the copy's own RNG stream."""
        ...

    def step(self, actions: np.ndarray) -> tuple[Step, float, bool, bool]:
        """(A,) int actions -> (next step, team reward, terminated, truncated), never both flags."""
        ...

    def episode_extras(self) -> dict[str, float]:
        """At an episode's end, the value of each ``extra_info_keys`` entry (without ``episode_``)."""
        ...

    def render_rgb(self) -> np.ndarray: ...

    def close(self) -> None: ...


class PyLoopVecEnv:
    """``num_envs`` :class:`OneEnv` copies stepping in one loop; tensors cross on ``device``.

    >>> env = make_marl_env("Foraging-8x8-2p-2f-coop-v3", num_envs=4, seed=0)  # doctest: +SKIP
    >>> env.reset().obs.shape
    torch.Size([4, 2, 12])
    """

    def __init__(self, envs: list[OneEnv], seed: int = 0, device: str | torch.device = "cpu"):
        self.envs = envs
        self.num_envs = len(envs)
        self.device = torch.device(device)
        self.seed = seed
        first = envs[0]
        self.n_agents, self.n_actions = first.n_agents, first.n_actions
        self.obs_dim, self.state_dim = first.obs_dim, first.state_dim
        self.episode_limit = first.episode_limit
        self.extra_info_keys = tuple(f"episode_{k}" for k in first.extra_info_keys)
        self._episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self._seeded = False

    def _tensor(self, x: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device, dtype, non_blocking=True)

    def _maobs(self, steps: list[Step], first: np.ndarray) -> MAObs:
        obs, state, avail = (np.stack(parts) for parts in zip(*steps, strict=True))
        return MAObs(self._tensor(obs), self._tensor(state), self._tensor(avail), self._tensor(first))

    def reset(self, seed: int | None = None) -> MAObs:
        """Reset every copy; copy ``i`` is seeded ``seed + i``.

        The first reset without a seed uses the constructor's seed (a run is reproducible);
        later ones continue each copy's RNG stream.
        """
        if seed is None and not self._seeded:
            seed = self.seed
        self._seeded = True
        steps = [env.reset(None if seed is None else seed + i) for i, env in enumerate(self.envs)]
        self._episode_return[:] = 0
        self._episode_length[:] = 0
        return self._maobs(steps, np.ones(self.num_envs, dtype=bool))

    def step(self, actions: torch.Tensor):
        act = actions.detach().cpu().numpy()
        if act.shape != (self.num_envs, self.n_agents):
            raise ValueError(
                f"actions must be (num_envs, n_agents) = {(self.num_envs, self.n_agents)}, got {act.shape}"
            )
        n = self.num_envs
        steps: list[Step] = []
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        finals: dict[int, Step] = {}
        extras = {k: np.zeros(n, dtype=np.float32) for k in self.extra_info_keys}
        for i, env in enumerate(self.envs):
            step, reward[i], terminated[i], truncated[i] = env.step(act[i])
            if terminated[i] or truncated[i]:
                finals[i] = step
                for key, value in env.episode_extras().items():
                    extras[f"episode_{key}"][i] = value
                step = env.reset(None)  # same-step auto-reset, continuing the copy's RNG
            steps.append(step)
        done = terminated | truncated
        self._episode_return += reward
        self._episode_length += 1
        info: dict[str, Any] = {
            "episode_return": self._tensor(self._episode_return.astype(np.float32)),
            "episode_length": self._tensor(self._episode_length.copy()),
            **{k: self._tensor(v) for k, v in extras.items()},
        }
        self._episode_return[done] = 0
        self._episode_length[done] = 0
        obs = self._maobs(steps, done)
        info["final_obs"] = obs  # most steps end no episode: no second conversion
        if finals:
            info["final_obs"] = self._maobs([finals.get(i, s) for i, s in enumerate(steps)], np.zeros(n, dtype=bool))
        return obs, self._tensor(reward), self._tensor(terminated), self._tensor(truncated), info

    def render_rgb(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of env 0, drawn without a display."""
        return self.envs[0].render_rgb()

    def close(self) -> None:
        for env in self.envs:
            env.close()


# -- helpers shared by the families ------------------------------------------------------------


def constructor_kwargs(
    task: str, kwargs: dict[str, Any], constructor: Callable, time_limit_name: str, reserved: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The constructor kwargs for ``task``: ``time_limit`` renamed, the rest checked by name.

    Unknown names are a UsageError listing the accepted ones, so that a typo does not
    silently train on the default task.
    """
    kwargs = dict(kwargs)
    if "time_limit" in kwargs:
        if time_limit_name in kwargs:
            raise UsageError(f"{task}: give time_limit or {time_limit_name}, not both")
        kwargs[time_limit_name] = kwargs.pop("time_limit")
    accepted = [p for p in inspect.signature(constructor).parameters if p not in ("self", *reserved)]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise UsageError(
            f"{task}: unknown env kwargs {', '.join(unknown)}; accepted: {', '.join(['time_limit', *accepted])}"
        )
    limit = kwargs.get(time_limit_name, 1)
    if not (isinstance(limit, int) and limit > 0):
        raise UsageError(f"{task}: time_limit must be a positive int (the episode buffer's length), got {limit!r}")
    return kwargs


def grid_frame(background: np.ndarray, squares: list[tuple], discs: list[tuple], cell: int = 32) -> np.ndarray:
    """Draw a grid world: ``background`` (H, W, 3) cell colours, then inset squares, then discs
    (``cell`` pixels a cell: a multiple of 16, the macro block video encoders want).

    ``squares`` and ``discs`` are (row, col, rgb); a disc with a fourth value ``d`` (0..3: up,
    down, left, right) gets a dark dot on that side, for the way an agent faces.
    """
    frame = np.repeat(np.repeat(background.astype(np.uint8), cell, 0), cell, 1)
    yy, xx = np.mgrid[:cell, :cell] + 0.5 - cell / 2
    square = (np.abs(yy) < cell * 0.38) & (np.abs(xx) < cell * 0.38)
    disc = yy**2 + xx**2 < (cell * 0.33) ** 2
    for (r, c, rgb), mask in [(s, square) for s in squares] + [(d[:3], disc) for d in discs]:
        frame[r * cell : (r + 1) * cell, c * cell : (c + 1) * cell][mask] = rgb
    offsets = [(-1, 0), (1, 0), (0, -1), (0, 1)]
    for r, c, _, *facing in discs:
        if facing:
            dy, dx = offsets[facing[0]]
            dot = (yy - dy * cell * 0.2) ** 2 + (xx - dx * cell * 0.2) ** 2 < (cell * 0.09) ** 2
            frame[r * cell : (r + 1) * cell, c * cell : (c + 1) * cell][dot] = (20, 20, 20)
    frame[::cell, :] = frame[:, ::cell] = (90, 90, 90)  # cell borders
    return frame


def shade(rgb: tuple[int, int, int], level: float, max_level: float) -> tuple[int, int, int]:
    """``rgb`` faded towards white for low levels: the level reads as colour intensity."""
    t = 0.35 + 0.65 * min(level / max(max_level, 1), 1.0)
    return tuple(int(255 - t * (255 - v)) for v in rgb)
