"""One Snake game in plain numpy, step by step, as a Gymnasium ``Env``.

It serves two purposes: the reference the batched :class:`ddprl.envs.snake.SnakeEnv` is tested
against (so it is written the obvious way, with a head-first list of body cells, sharing no
game logic with the tensor version), and the slow baseline inside
``gymnasium.vector.SyncVectorEnv`` for benchmarks. Rules, actions and observation channels are
those of :mod:`ddprl.envs.snake`; only the random streams differ.

>>> env = SnakeGymEnv(grid_size=6)
>>> obs, info = env.reset(seed=0)
>>> obs.shape
(7, 6, 6)
>>> obs, reward, terminated, truncated, info = env.step(1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from ddprl.envs.snake import (
    DELTAS,
    OBS_CHANNELS,
    START_LENGTH,
    check_board,
    default_max_steps_without_food,
    render_rgb,
    render_text,
)


class SnakeGymEnv(gym.Env):
    """Single-game Snake with the same rules and observations as ``SnakeEnv``.

    ``info`` carries ``score`` (food eaten this episode) and ``length`` (snake length).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 10}

    def __init__(
        self,
        grid_size: int = 10,
        step_penalty: float = 0.0,
        max_steps_without_food: int | None = None,
        obs_mode: str = "planes",
        render_mode: str | None = None,
    ):
        if grid_size < 4:
            raise ValueError("grid_size must be >= 4")
        if obs_mode not in OBS_CHANNELS:
            raise ValueError(f"obs_mode must be one of {sorted(OBS_CHANNELS)}")
        self.grid_size, self.obs_mode, self.render_mode = grid_size, obs_mode, render_mode
        self.step_penalty = float(step_penalty)
        self.max_steps_without_food = int(max_steps_without_food or default_max_steps_without_food(grid_size))
        shape = (OBS_CHANNELS[obs_mode], grid_size, grid_size)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape, np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.body: deque[tuple[int, int]] = deque()  # head first
        self.direction, self.food, self.steps_since_food, self.score = 0, None, 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        g, rng = self.grid_size, self.np_random
        # Same start distribution as SnakeEnv: uniform direction, then uniform over the
        # placements where the 3-cell body and one free cell ahead fit on the board.
        d = int(rng.integers(4))
        dr, dc = DELTAS[d]
        starts = [
            (r, c)
            for r in range(g)
            for c in range(g)
            if all(0 <= r + k * dr < g and 0 <= c + k * dc < g for k in (-2, -1, 0, 1))
        ]
        r, c = starts[int(rng.integers(len(starts)))]
        self.body = deque((r - k * dr, c - k * dc) for k in range(START_LENGTH))
        self.direction, self.steps_since_food, self.score = d, 0, 0
        self._place_food()
        return self._obs(), self._info()

    def step(self, action):
        a = int(action)
        # Reversing into the neck is ignored: keep going straight.
        d = self.direction if a == (self.direction + 2) % 4 else a
        (hr, hc), (dr, dc) = self.body[0], DELTAS[d]
        head = (hr + dr, hc + dc)
        eats = head == self.food
        # Cells still occupied after the move: the tail leaves unless the snake eats.
        blocking = list(self.body) if eats else list(self.body)[:-1]
        g = self.grid_size
        if not (0 <= head[0] < g and 0 <= head[1] < g) or head in blocking:
            return self._obs(), -1.0, True, False, self._info()  # board stays pre-move
        self.direction = d
        self.body.appendleft(head)
        if eats:
            self.score += 1
            self.steps_since_food = 0
            if len(self.body) == g * g:
                self.food = None
                return self._obs(), 1.0, True, False, self._info()  # won: board full
            self._place_food()
            return self._obs(), 1.0, False, False, self._info()
        self.body.pop()
        self.steps_since_food += 1
        truncated = self.steps_since_food >= self.max_steps_without_food
        return self._obs(), 0.0 - self.step_penalty, False, truncated, self._info()

    def render(self):
        if self.render_mode == "ansi":
            return render_text(self._obs())
        if self.render_mode == "rgb_array":
            return render_rgb(self._obs())
        return None

    # ------------------------------------------------------------------ helpers
    def set_state(self, body: Sequence[tuple[int, int]], direction: int, food, steps_since_food: int = 0) -> None:
        """Put the game on a hand-made board (same arguments as ``SnakeEnv.set_state``)."""
        check_board(self.grid_size, body, direction, food)
        self.body = deque((int(r), int(c)) for r, c in body)
        self.direction, self.steps_since_food, self.score = int(direction), steps_since_food, 0
        self.food = None if food is None else (int(food[0]), int(food[1]))

    def set_food(self, food: tuple[int, int]) -> None:
        """Move the food (tests copy the batched env's draw here to sync the two RNGs)."""
        if tuple(food) in self.body:
            raise ValueError("food on the snake")
        self.food = (int(food[0]), int(food[1]))

    def observe(self) -> np.ndarray:
        return self._obs()

    def _place_food(self) -> None:
        g = self.grid_size
        occupied = set(self.body)
        free = [(r, c) for r in range(g) for c in range(g) if (r, c) not in occupied]
        self.food = free[int(self.np_random.integers(len(free)))]

    def _obs(self) -> np.ndarray:
        g, n = self.grid_size, len(self.body)
        obs = np.zeros((OBS_CHANNELS[self.obs_mode], g, g), np.float32)
        obs[0][self.body[0]] = 1.0
        for k, cell in enumerate(self.body):  # k-th from the head is (n-k)-th from the tail
            obs[1][cell] = np.float32(n - k) / np.float32(n)
        if self.food is not None:
            obs[2][self.food] = 1.0
        if self.obs_mode == "planes":
            obs[3 + self.direction] = 1.0
        return obs

    def _info(self) -> dict:
        return {"score": self.score, "length": len(self.body)}
