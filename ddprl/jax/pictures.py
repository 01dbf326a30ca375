"""Frames of gymnax tasks that Gymnasium cannot draw, for ``ddprl play ... video=`` (engine=jax).

Drawn on the host from one env's state (numpy leaves), in numpy and Pillow:

- grid observations, one colour per channel: the MinAtar games, Catch-bsuite, DeepSea-bsuite,
  Pong-misc (what the agent sees is the picture);
- grid worlds: FourRooms-misc and MetaMaze-misc (walls, goal, agent), FrozenLake-misc;
- points in a plane: PointRobot-misc, Reacher-misc (the arm), Swimmer-misc (urchins, goal).

Bandits and chains (SimpleBandit, MemoryChain, ...) have no scene: :func:`gymnax_picture`
returns None for them and a video is refused with a message saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

SIZE = 320  # pixels of a frame's longer side
GRID_OBSERVATIONS = (
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Catch-bsuite",
    "DeepSea-bsuite",
    "Pong-misc",
)
# one colour per observation channel (then repeated), on a dark background
PALETTE = np.array(
    [
        (240, 240, 240),
        (230, 90, 60),
        (80, 170, 230),
        (250, 200, 60),
        (120, 200, 90),
        (200, 110, 220),
        (60, 200, 190),
        (245, 150, 170),
        (150, 150, 255),
        (200, 200, 120),
    ],
    np.uint8,
)
BACKGROUND = np.array((25, 25, 35), np.uint8)


def gymnax_picture(name: str, env: Any, params: Any) -> Callable[[Any], np.ndarray] | None:
    """``render(state) -> (H, W, 3) uint8`` for gymnax task ``name``; None when it has no scene."""
    if name in GRID_OBSERVATIONS:
        import jax

        observe = jax.jit(lambda state: env.get_obs(state, params))
        return lambda state: observation_picture(np.asarray(observe(state)))
    if name in ("FourRooms-misc", "MetaMaze-misc"):
        walls = np.asarray(env.occupied_map) > 0
        return lambda state: maze_picture(walls, tuple(np.asarray(state.pos)), tuple(np.asarray(state.goal)))
    if name == "FrozenLake-misc":
        return _frozen_lake(env)
    if name == "PointRobot-misc":
        radius = float(params.goal_radius)
        return lambda state: plane_picture(
            1.5,
            goals=[(np.asarray(state.goal), radius)],
            agents=[np.asarray(state.pos)],
            arc=float(params.circle_radius),
        )
    if name == "Reacher-misc":
        reach = float(env.num_joints)
        return lambda state: plane_picture(
            reach + 0.5, goals=[(np.asarray(state.goal_xy), 0.15)], arm=np.asarray(state.angles)
        )
    if name == "Swimmer-misc":
        return lambda state: plane_picture(
            2.0,
            goals=[(np.asarray(state.goal_xy), 0.15)],
            agents=[np.asarray(state.xy)],
            obstacles=np.asarray(state.urchin_xys),
        )
    return None


def _cells(colours: np.ndarray) -> np.ndarray:
    """(H, W, 3) cell colours -> a frame of about SIZE pixels, thin dark lines between cells."""
    h, w = colours.shape[:2]
    cell = max(8, SIZE // max(h, w))
    frame = np.repeat(np.repeat(colours.astype(np.uint8), cell, 0), cell, 1)
    frame[::cell, :] = frame[:, ::cell] = (60, 60, 70)
    return frame


def observation_picture(obs: np.ndarray) -> np.ndarray:
    """A grid observation drawn as cells: (H, W) values in [0, 1] as brightness; (H, W, C): the
    colour of the last channel set in a cell (as gymnax's own MinAtar pictures)."""
    obs = np.asarray(obs, np.float32)
    if obs.ndim == 2:
        v = np.clip(obs, 0, 1)[..., None]
        return _cells(BACKGROUND * (1 - v) + PALETTE[0] * v)
    on = obs > 0.5
    top = np.where(on.any(-1), obs.shape[-1] - 1 - np.argmax(on[..., ::-1], -1), -1)
    colours = np.where((top >= 0)[..., None], PALETTE[np.maximum(top, 0) % len(PALETTE)], BACKGROUND)
    return _cells(colours)


def maze_picture(walls: np.ndarray, agent: tuple[int, int], goal: tuple[int, int]) -> np.ndarray:
    """Walls dark, free cells light, the goal green, the agent blue ((row, col) positions)."""
    colours = np.where(walls[..., None], np.array((70, 70, 80), np.uint8), np.array((235, 235, 225), np.uint8))
    colours[int(goal[0]), int(goal[1])] = (90, 190, 90)
    colours[int(agent[0]), int(agent[1])] = (50, 90, 220)
    return _cells(colours)


def _frozen_lake(env: Any) -> Callable[[Any], np.ndarray]:
    from gymnax.environments.misc.frozen_lake import GOAL, HOLE, START

    desc = np.asarray(env.desc)
    tiles = np.full((*desc.shape, 3), (200, 225, 245), np.uint8)  # ice
    tiles[desc == HOLE] = (30, 50, 110)
    tiles[desc == GOAL] = (90, 190, 90)
    tiles[desc == START] = (235, 235, 225)

    def render(state: Any) -> np.ndarray:
        colours = tiles.copy()
        row, col = divmod(int(np.asarray(state.position)), desc.shape[1])
        colours[row, col] = (220, 90, 40)
        return _cells(colours)

    return render


def plane_picture(
    extent: float,
    goals: list[tuple[np.ndarray, float]] = (),
    agents: list[np.ndarray] = (),
    obstacles: np.ndarray | None = None,
    arm: np.ndarray | None = None,
    arc: float | None = None,
) -> np.ndarray:
    """Points of the square [-extent, extent]^2 (y up): goals as green circles of their radius,
    obstacles red, agents blue; ``arm``: unit links at these absolute angles from the origin;
    ``arc``: the upper half circle of that radius (where PointRobot's goals lie)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), (245, 245, 240))
    draw = ImageDraw.Draw(image)
    scale = SIZE / (2 * extent)

    def px(xy: np.ndarray) -> tuple[float, float]:
        return (float(xy[0]) + extent) * scale, (extent - float(xy[1])) * scale

    def disc(xy: np.ndarray, r: float, fill: tuple[int, int, int]) -> None:
        x, y = px(xy)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)

    if arc is not None:
        (x0, y0), (x1, y1) = px(np.array((-arc, arc))), px(np.array((arc, -arc)))
        draw.arc((x0, y0, x1, y1), 180, 360, fill=(150, 150, 150), width=2)
    for centre, radius in goals:
        disc(centre, max(radius * scale, 4), (120, 200, 120))
    for xy in [] if obstacles is None else obstacles:
        disc(xy, 6, (210, 70, 60))
    if arm is not None:
        joints = np.vstack([np.zeros(2), np.cumsum(np.stack([np.cos(arm), np.sin(arm)], -1), 0)])
        draw.line([px(j) for j in joints], fill=(50, 90, 220), width=5)
        for j in joints:
            disc(j, 5, (30, 30, 30))
    for xy in agents:
        disc(xy, 8, (50, 90, 220))
    return np.asarray(image)
