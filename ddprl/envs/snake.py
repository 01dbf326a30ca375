"""Snake as a batched torch environment: N games advance in one set of tensor ops.

Rules (shared exactly with the numpy reference ``ddprl.envs.snake_gym.SnakeGymEnv``):

- Board ``grid_size x grid_size`` surrounded by walls. A new episode starts with a straight
  snake of length 3 whose head faces away from its body with at least one free cell ahead
  (never a forced death): direction uniform, then position uniform among those that fit.
- Actions are **absolute** directions, ``Discrete(4)``: 0 up (row-1), 1 right (col+1),
  2 down (row+1), 3 left (col-1). An action that reverses the current direction
  (straight back into the neck) is ignored: the snake keeps going straight.
- The head moves one cell. It dies (reward -1, terminated) by leaving the board or entering a
  body cell. The tail cell is vacated in the same step unless the snake eats, so following
  one's own tail is legal. (The "unless it eats" clause can never bite: food never lies on
  the snake, so the eating move never targets the tail.) On death the board is left as it
  was before the fatal move, so ``final_obs`` shows the pre-move board.
- Entering the food cell: reward +1, length +1 at once (the tail stays put this step), new
  food uniform over the free cells. Filling the whole board is a win: reward +1 and
  terminated, with no food drawn on the final board.
- Any other step (a plain move) gives ``-step_penalty``. After ``max_steps_without_food``
  consecutive steps without eating (default ``4 * grid_size**2``) the episode is truncated.

Observation ``(C, H, W)`` float32 in [0, 1], channels:
    0 head (1 at the head), 1 body order (cell k-th from the tail holds k/L: head 1, tail 1/L,
    0 empty), 2 food, and for ``obs_mode="planes"`` 3..6 constant one-hot planes of the
    current direction (up, right, down, left). ``obs_mode="compact"`` keeps only 0..2; the
    direction is then readable from the neck in channel 1.

``info`` (all (N,) tensors, valid where ``terminated | truncated``): ``final_obs``
(N, C, H, W), ``episode_return`` float32, ``episode_length`` int64 (moves),
``episode_score`` int64 (food eaten).

State representation: ``body`` (N, H*W) holds for every cell its remaining lifetime in steps
(tail 1, head L, empty 0). A plain move is "subtract 1 from every positive cell, write L at
the new head", eating skips the subtraction, so a step is O(N*H*W) with no per-game loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
DELTAS = ((-1, 0), (0, 1), (1, 0), (0, -1))  # (d_row, d_col) per action
START_LENGTH = 3
OBS_CHANNELS = {"planes": 7, "compact": 3}


def default_max_steps_without_food(grid_size: int) -> int:
    """Truncation limit used when none is given: four board-sweeps without eating."""
    return 4 * grid_size * grid_size


def check_board(grid_size: int, body: Sequence[tuple[int, int]], direction: int, food) -> None:
    """Validate a hand-made board (head-first ``body``); raises ``ValueError`` if illegal."""
    cells = [tuple(map(int, rc)) for rc in body]
    if not cells or len(set(cells)) != len(cells):
        raise ValueError("body must be a non-empty list of distinct cells")
    for r, c in cells:
        if not (0 <= r < grid_size and 0 <= c < grid_size):
            raise ValueError(f"body cell {(r, c)} is off the board")
    for (r0, c0), (r1, c1) in zip(cells, cells[1:]):
        if abs(r0 - r1) + abs(c0 - c1) != 1:
            raise ValueError(f"body cells {(r0, c0)} and {(r1, c1)} are not adjacent")
    if direction not in (UP, RIGHT, DOWN, LEFT):
        raise ValueError("direction must be 0..3")
    if len(cells) > 1:  # the head must have arrived from the neck, else the reversal rule lies
        dr, dc = DELTAS[direction]
        if (cells[1][0] + dr, cells[1][1] + dc) != cells[0]:
            raise ValueError("direction disagrees with the head/neck positions")
    if food is None:
        if len(cells) != grid_size * grid_size:
            raise ValueError("food may only be None when the snake fills the board")
    else:
        fr, fc = map(int, food)
        if not (0 <= fr < grid_size and 0 <= fc < grid_size) or (fr, fc) in cells:
            raise ValueError("food must be a free cell on the board")


def render_text(obs) -> str:
    """Text picture of one observation (C, H, W) (tensor or array).

    ``^>v<`` head (``H`` in compact mode), ``o`` body, ``t`` tail, ``*`` food, ``.`` empty.

    >>> env = SnakeEnv(1, grid_size=4)
    >>> env.set_state(0, [(1, 1), (2, 1)], UP, food=(0, 3))
    >>> print(render_text(env.observe()[0]))
    +----+
    |...*|
    |.^..|
    |.t..|
    |....|
    +----+
    """
    o = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
    h, w = o.shape[1:]
    body = o[1]
    tail = body == body[body > 0].min() if (body > 0).any() else np.zeros_like(body, bool)
    head_ch = "^>v<"[int(o[3:7, 0, 0].argmax())] if o.shape[0] == 7 else "H"
    rows = ["+" + "-" * w + "+"]
    for r in range(h):
        line = ""
        for c in range(w):
            if o[0, r, c] > 0:
                line += head_ch
            elif o[2, r, c] > 0:
                line += "*"
            elif body[r, c] > 0:
                line += "t" if tail[r, c] and body[r, c] < 1 else "o"
            else:
                line += "."
        rows.append("|" + line + "|")
    rows.append(rows[0])
    return "\n".join(rows)


def render_rgb(obs, px: int = 20) -> np.ndarray:
    """RGB picture (H*px, W*px, 3) uint8 of one observation, for GIFs.

    The body fades from bright green at the neck to dark green at the tail.
    """
    o = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
    img = np.empty(o.shape[1:] + (3,), np.float32)
    img[:] = (24, 24, 32)
    body = o[1][..., None]
    img = np.where(body > 0, np.array([30, 90, 30]) + body * np.array([40, 140, 40]), img)
    img = np.where(o[2][..., None] > 0, np.array([220, 50, 50]), img)
    img = np.where(o[0][..., None] > 0, np.array([250, 230, 60]), img)
    img = img.astype(np.uint8).repeat(px, axis=0).repeat(px, axis=1)
    if px >= 4:  # thin dark grid lines so neighbouring body cells stay distinguishable
        img[::px, :] = img[:, ::px] = (12, 12, 16)
    return img


class SnakeEnv:
    """``num_envs`` Snake games on one device, stepping together (see module docstring).

    Satisfies :class:`ddprl.envs.base.VecEnv`; auto-resets finished games in the same step.
    All games share one ``torch.Generator`` on ``device`` seeded with ``seed``, so a run is
    reproducible for a given (seed, num_envs, device); unlike the protocol's "env i gets
    seed + i", single games are not individually seeded (that would need a per-game loop).

    >>> env = SnakeEnv(num_envs=8, grid_size=10, seed=1)
    >>> obs = env.reset()
    >>> obs.shape
    torch.Size([8, 7, 10, 10])
    >>> obs, rew, term, trunc, info = env.step(torch.zeros(8, dtype=torch.long))
    """

    def __init__(
        self,
        num_envs: int,
        grid_size: int = 10,
        device="cpu",
        seed: int = 0,
        step_penalty: float = 0.0,
        max_steps_without_food: int | None = None,
        obs_mode: str = "planes",
    ):
        if grid_size < 4:
            raise ValueError("grid_size must be >= 4 (a length-3 start plus one free cell)")
        if obs_mode not in OBS_CHANNELS:
            raise ValueError(f"obs_mode must be one of {sorted(OBS_CHANNELS)}")
        self.num_envs, self.grid_size, self.obs_mode = int(num_envs), int(grid_size), obs_mode
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.step_penalty = float(step_penalty)
        # None (or 0) means the default, 4 * grid_size**2.
        self.max_steps_without_food = int(max_steps_without_food or default_max_steps_without_food(grid_size))
        c, g = OBS_CHANNELS[obs_mode], self.grid_size
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, (c, g, g), np.float32)
        self.single_action_space = gym.spaces.Discrete(4)
        self.extra_info_keys = ("episode_score",)  # reported by eval next to return and length
        dev, n = self.device, self.num_envs
        self._dr = torch.tensor([d[0] for d in DELTAS], device=dev)  # (4,)
        self._dc = torch.tensor([d[1] for d in DELTAS], device=dev)  # (4,)
        self._dirs = torch.arange(4, device=dev)  # (4,)
        self._gen = torch.Generator(device=dev)
        self._gen.manual_seed(int(seed))
        # Per-game state; all (N,) int64 except body (N, H*W) int32 lifetimes.
        self.body = torch.zeros(n, g * g, dtype=torch.int32, device=dev)
        z = lambda: torch.zeros(n, dtype=torch.long, device=dev)  # noqa: E731
        self.head_r, self.head_c, self.direction, self.length, self.food = z(), z(), z(), z(), z()
        self.steps_since_food, self.ep_length, self.ep_score = z(), z(), z()
        self.ep_return = torch.zeros(n, dtype=torch.float32, device=dev)
        # Usable without reset(); the generator is rewound so that the first reset() gives
        # this same board, i.e. SnakeEnv(seed=s).reset() == env.reset(seed=s).
        self._start_new(torch.ones(n, dtype=torch.bool, device=dev), self._draw())
        self._gen.manual_seed(int(seed))

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a fresh episode in every game; reseeds the shared generator if ``seed``."""
        if seed is not None:
            self._gen.manual_seed(int(seed))
        self._start_new(torch.ones(self.num_envs, dtype=torch.bool, device=self.device), self._draw())
        self.ep_return.zero_(), self.ep_length.zero_(), self.ep_score.zero_()
        return self.observe()

    def step(self, actions: torch.Tensor):
        """Advance every game one move; ``actions`` (N,) ints in 0..3 (see module docs)."""
        # torch.compile cannot trace an explicit Generator, so the random draw stays outside
        # ``advance``, which is pure tensor code: compile that one (fullgraph=True works).
        actions = torch.as_tensor(actions).to(self.device, torch.long).reshape(self.num_envs)
        return self.advance(actions, self._draw())

    # ``advance`` traces into one graph (PPO's rollout step, ddprl.algos.ppo.rollout): the
    # random draw is an argument, nothing is read on the host, and every state tensor is
    # updated in place, so that a CUDA graph replays on the same addresses.
    traceable_step = True

    def advance(self, actions: torch.Tensor, rnd: torch.Tensor):
        """``step`` given ``actions`` (N,) int64 on the env's device and this step's random
        integers ``rnd`` (3, N) from ``_draw`` (or :meth:`draw_into`)."""
        g = self.grid_size
        new_dir = torch.where(actions == (self.direction + 2) % 4, self.direction, actions)  # (N,)
        nr, nc = self.head_r + self._dr[new_dir], self.head_c + self._dc[new_dir]
        hit_wall = (nr < 0) | (nr >= g) | (nc < 0) | (nc >= g)
        # Clamped so the gather stays in bounds for wall hits; those games die regardless.
        target = nr.clamp(0, g - 1) * g + nc.clamp(0, g - 1)  # (N,)
        cell = self.body.gather(1, target[:, None]).squeeze(1)  # (N,) lifetime at target
        eat = ~hit_wall & (target == self.food)
        # Lifetime 1 is the tail, which leaves this step unless the snake eats.
        hit_body = ~hit_wall & (cell > (~eat).to(cell.dtype))
        dead = hit_wall | hit_body
        alive, grow = ~dead, ~dead & eat
        move = alive & ~eat

        self.body.sub_(move[:, None].to(torch.int32)).clamp_(min=0)
        self.length.add_(grow.long())
        # Dead games write back the value they already had, leaving the board untouched.
        head_val = torch.where(alive, self.length.to(torch.int32), cell)
        self.body.scatter_(1, target[:, None], head_val[:, None])
        self.head_r.copy_(torch.where(alive, nr, self.head_r))
        self.head_c.copy_(torch.where(alive, nc, self.head_c))
        self.direction.copy_(torch.where(alive, new_dir, self.direction))

        win = grow & (self.length == g * g)
        self.food.copy_(torch.where(win, -1, self.food))  # a full board has nowhere to put food
        penalty = torch.full_like(self.ep_return, 0.0 - self.step_penalty)
        reward = torch.where(grow, 1.0, torch.where(dead, -1.0, penalty))  # (N,) float32
        self.steps_since_food.copy_(torch.where(grow, 0, self.steps_since_food + 1))
        terminated = dead | win
        truncated = move & (self.steps_since_food >= self.max_steps_without_food)
        done = terminated | truncated

        ep_return, ep_length = self.ep_return + reward, self.ep_length + 1
        ep_score = self.ep_score + grow.long()
        final_obs = self.observe()
        self._start_new(done, rnd, new_food=grow)
        self.ep_return.copy_(torch.where(done, 0.0, ep_return))
        self.ep_length.copy_(torch.where(done, 0, ep_length))
        self.ep_score.copy_(torch.where(done, 0, ep_score))
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "episode_return": ep_return,
            "episode_length": ep_length,
            "episode_score": ep_score,
        }
        return self.observe(), reward, terminated, truncated, info

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ exact resume
    _STATE = (
        "body",
        "head_r",
        "head_c",
        "direction",
        "length",
        "food",
        "steps_since_food",
        "ep_length",
        "ep_score",
        "ep_return",
    )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every game's board and counters plus the generator: a checkpoint resumes mid-episode."""
        state = {k: getattr(self, k).clone() for k in self._STATE}
        state["generator"] = self._gen.get_state()
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """Restore :meth:`state_dict`; returns the current observation."""
        for k in self._STATE:  # in place: a compiled rollout holds these very tensors
            getattr(self, k).copy_(state[k])
        self._gen.set_state(state["generator"])
        return self.observe()

    # ------------------------------------------------------------------ internals
    def observe(self) -> torch.Tensor:
        """Observation of the current state, (N, C, H, W) float32 (channels: module docs)."""
        n, hw = self.num_envs, self.grid_size**2
        obs = torch.zeros(n, OBS_CHANNELS[self.obs_mode], hw, device=self.device)
        obs[:, 1] = self.body / self.length[:, None].float()
        # Head and food as one scatter into the flattened (C*H*W) planes; a won board has
        # food -1, which writes a harmless 0 into channel 2 instead of a 1.
        ones = torch.stack([torch.ones_like(self.ep_return), (self.food >= 0).float()], 1)
        spots = torch.stack([self.head_r * self.grid_size + self.head_c, 2 * hw + self.food.clamp(min=0)], 1)  # (N, 2)
        obs.view(n, -1).scatter_(1, spots, ones)
        if self.obs_mode == "planes":
            obs[:, 3:7] = (self.direction[:, None] == self._dirs).float()[:, :, None]
        return obs.view(n, -1, self.grid_size, self.grid_size)

    def _draw(self) -> torch.Tensor:
        """(3, N) uniform int64 in [0, 2**62): start direction, start spot, food pick. Drawn
        for every game every step, used where needed (fixed shapes, no host sync); reducing
        them modulo a count n is biased by under n / 2**62, i.e. not measurably."""
        return torch.randint(0, 2**62, (3, self.num_envs), generator=self._gen, device=self.device)

    @property
    def draw_shape(self) -> tuple[int, int]:
        """Shape of one step's random integers ``rnd``: (3, N)."""
        return (3, self.num_envs)

    def draw_into(self, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` (K, 3, N) int64 with K steps' draws (``_draw``'s range) from this env's
        generator, in place: the random inputs of K ``advance`` calls inside a compiled graph."""
        return out.random_(0, 2**62, generator=self._gen)

    def _start_new(self, mask: torch.Tensor, rnd: torch.Tensor, new_food: torch.Tensor | None = None) -> None:
        """Respawn games where ``mask`` (N,) bool, then redraw food where respawned or
        ``new_food``, using the random integers ``rnd`` (3, N) from ``_draw``."""
        n, g = self.num_envs, self.grid_size
        d, k = rnd[0] % 4, rnd[1]
        vertical = d % 2 == 0
        # Placements keeping the body and one cell ahead of the head on the board: the
        # 4-cell span along the direction has g-3 positions, the other axis g.
        nrow, ncol = torch.where(vertical, g - 3, g), torch.where(vertical, g, g - 3)
        k = k % (nrow * ncol)
        r, c = k // ncol, k % ncol
        hr = torch.where(vertical, r + 1 + (d == DOWN).long(), r)
        hc = torch.where(vertical, c, c + 1 + (d == RIGHT).long())
        steps = torch.arange(START_LENGTH, device=self.device)  # 0 head, 1 neck, 2 tail
        cells = (hr[:, None] - self._dr[d][:, None] * steps) * g + hc[:, None] - self._dc[d][:, None] * steps  # (N, 3)
        lifetimes = (START_LENGTH - steps).to(torch.int32).expand(n, -1)  # 3, 2, 1
        self.body *= ~mask[:, None]
        kept = self.body.gather(1, cells)  # untouched games write their own values back
        self.body.scatter_(1, cells, torch.where(mask[:, None], lifetimes, kept))
        self.head_r.copy_(torch.where(mask, hr, self.head_r))
        self.head_c.copy_(torch.where(mask, hc, self.head_c))
        self.direction.copy_(torch.where(mask, d, self.direction))
        self.length.copy_(torch.where(mask, START_LENGTH, self.length))
        self.steps_since_food.copy_(torch.where(mask, 0, self.steps_since_food))
        if new_food is not None:
            mask = mask | new_food
        # Uniform over free cells: k uniform in [0, #free), then the k-th free cell, i.e. the
        # number of cells whose running count of free cells is still <= k.
        n_free = (g * g - self.length).clamp(min=1)
        k = rnd[2] % n_free
        free_before = (self.body == 0).cumsum(1)  # (N, H*W)
        pick = (free_before <= k[:, None]).sum(1)
        self.food.copy_(torch.where(mask, pick, self.food))

    # ------------------------------------------------------------------ test / debug helpers
    def set_state(
        self, i: int, body: Sequence[tuple[int, int]], direction: int, food, steps_since_food: int = 0
    ) -> None:
        """Put game ``i`` on a hand-made board and start a fresh episode there.

        ``body`` lists (row, col) cells head first, ``direction`` is the last move (must
        match head minus neck), ``food`` a free (row, col), or None if the body fills the board.

        >>> env = SnakeEnv(2, grid_size=5)
        >>> env.set_state(1, [(2, 2), (2, 1), (2, 0)], RIGHT, food=(0, 0))
        """
        g = self.grid_size
        check_board(g, body, direction, food)
        life = torch.zeros(g * g, dtype=torch.int32)
        for k, (r, c) in enumerate(body):
            life[r * g + c] = len(body) - k
        self.body[i] = life.to(self.device)
        self.head_r[i], self.head_c[i] = int(body[0][0]), int(body[0][1])
        self.direction[i], self.length[i] = int(direction), len(body)
        self.food[i] = -1 if food is None else int(food[0]) * g + int(food[1])
        self.steps_since_food[i] = int(steps_since_food)
        self.ep_return[i], self.ep_length[i], self.ep_score[i] = 0.0, 0, 0

    def set_food(self, i: int, food: tuple[int, int]) -> None:
        """Move game ``i``'s food to the free cell ``food`` (tests; keeps episode stats)."""
        g, (r, c) = self.grid_size, (int(food[0]), int(food[1]))
        if not (0 <= r < g and 0 <= c < g) or int(self.body[i, r * g + c]) > 0:
            raise ValueError("food must be a free cell on the board")
        self.food[i] = r * g + c

    def get_state(self, i: int) -> dict:
        """Board of game ``i`` in ``set_state``'s terms (host sync; for tests and debugging)."""
        g = self.grid_size
        life = self.body[i].cpu()
        order = [int(x) for x in torch.argsort(life, descending=True)[: int((life > 0).sum())]]
        food = int(self.food[i])
        return {
            "body": [(x // g, x % g) for x in order],
            "direction": int(self.direction[i]),
            "food": None if food < 0 else (food // g, food % g),
            "steps_since_food": int(self.steps_since_food[i]),
        }

    def render_ascii(self, i: int = 0) -> str:
        """Text picture of game ``i`` (see :func:`render_text`)."""
        return render_text(self.observe()[i])

    def render_rgb(self, i: int = 0, px: int = 20) -> np.ndarray:
        """(H*px, W*px, 3) uint8 picture of game ``i`` (see :func:`render_rgb`)."""
        return render_rgb(self.observe()[i], px)
