"""Frames of Gymnasium's classic control tasks drawn with Pillow, for an install without pygame.

Gymnasium draws CartPole, Pendulum, Acrobot and the two MountainCars with pygame, which the base
install does not have (``pip install "ddprl[video]"`` adds it). These pictures are drawn from the
same physics state (``env.unwrapped.state``) at Gymnasium's frame sizes and scales, so that a
video of the default job needs nothing beyond the base install. :func:`classic_picture` returns
None for any other env.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import numpy as np

SKY, INK = (255, 255, 255), (0, 0, 0)


def pygame_available() -> bool:
    """Whether Gymnasium can draw with pygame here (``pygame`` or ``pygame-ce``: one module name)."""
    return importlib.util.find_spec("pygame") is not None


def classic_picture(env: Any) -> np.ndarray | None:
    """(H, W, 3) uint8 frame of the classic control env ``env`` (its unwrapped class decides), or
    None when it is not one of them or has no state yet (before its first reset)."""
    inner = getattr(env, "unwrapped", env)
    draw = _DRAWERS.get(type(inner).__name__)
    state = getattr(inner, "state", None)
    if draw is None or state is None:
        return None
    return draw(inner, np.asarray(state, np.float64))


def _canvas(width: int, height: int) -> tuple[Any, Any]:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), SKY)
    return image, ImageDraw.Draw(image)


def _bar(start: tuple[float, float], angle: float, length: float, width: float) -> list[tuple[float, float]]:
    """The corners of a bar of ``width`` from ``start`` along ``angle`` (radians, image coordinates)."""
    dx, dy = math.cos(angle), math.sin(angle)
    nx, ny = -dy * width / 2, dx * width / 2
    ex, ey = start[0] + dx * length, start[1] + dy * length
    return [(start[0] + nx, start[1] + ny), (ex + nx, ey + ny), (ex - nx, ey - ny), (start[0] - nx, start[1] - ny)]


def _dot(draw: Any, centre: tuple[float, float], radius: float, fill: tuple[int, int, int]) -> None:
    x, y = centre
    draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=fill)


def _cartpole(env: Any, state: np.ndarray) -> np.ndarray:
    """A cart on a track with its pole; the track spans ``[-x_threshold, x_threshold]``."""
    width, height = 600, 400
    scale = width / (2 * env.x_threshold)
    image, draw = _canvas(width, height)
    track_y = height - 100
    draw.line((0, track_y, width, track_y), fill=INK)
    cart_x = state[0] * scale + width / 2
    cart_w, cart_h = 50, 30
    draw.rectangle((cart_x - cart_w / 2, track_y - cart_h / 2, cart_x + cart_w / 2, track_y + cart_h / 2), fill=INK)
    axle = (cart_x, track_y - cart_h / 4)
    # theta 0 is upright, positive to the right: the pole's angle from the image's x axis
    pole = _bar(axle, state[2] - math.pi / 2, scale * 2 * env.length, 10)
    draw.polygon(pole, fill=(202, 152, 101))
    _dot(draw, axle, 5, (129, 132, 203))
    return np.asarray(image)


def _pendulum(env: Any, state: np.ndarray) -> np.ndarray:
    """The rod from its pivot; theta 0 points up, positive counter-clockwise."""
    size = 500
    image, draw = _canvas(size, size)
    centre = (size / 2, size / 2)
    scale = size / 4.4  # Gymnasium's view: [-2.2, 2.2] on each axis
    draw.polygon(_bar(centre, -state[0] - math.pi / 2, scale, 0.2 * scale), fill=(204, 77, 77))
    _dot(draw, centre, 0.05 * scale, INK)
    return np.asarray(image)


def _acrobot(env: Any, state: np.ndarray) -> np.ndarray:
    """Two links hanging from the pivot (angles 0: straight down); the line the tip must cross."""
    size = 500
    bound = env.LINK_LENGTH_1 + env.LINK_LENGTH_2 + 0.2
    scale = size / (2 * bound)
    image, draw = _canvas(size, size)
    pivot = (size / 2, size / 2)
    line_y = size / 2 - 1.0 * scale
    draw.line((0, line_y, size, line_y), fill=INK)
    first = math.pi / 2 - state[0]  # straight down is +pi/2 from the image's x axis; angles grow to the right
    reach = env.LINK_LENGTH_1 * scale
    elbow = (pivot[0] + reach * math.cos(first), pivot[1] + reach * math.sin(first))
    for start, angle, length in ((pivot, first, env.LINK_LENGTH_1), (elbow, first - state[1], env.LINK_LENGTH_2)):
        draw.polygon(_bar(start, angle, length * scale, 0.2 * scale), fill=(0, 204, 204))
        _dot(draw, start, 0.1 * scale, (204, 204, 0))
    return np.asarray(image)


def _mountain_car(env: Any, state: np.ndarray) -> np.ndarray:
    """The hill ``sin(3x)``, the car on it tilted with the slope, the flag at the goal."""
    width, height = 600, 400
    scale = width / (env.max_position - env.min_position)
    image, draw = _canvas(width, height)

    def point(x: float, lift: float = 0.0) -> tuple[float, float]:
        return ((x - env.min_position) * scale, height - (math.sin(3 * x) * 0.45 + 0.55) * scale - lift)

    xs = np.linspace(env.min_position, env.max_position, 100)
    draw.line([point(float(x)) for x in xs], fill=INK, width=2)
    flag_x, flag_y = point(env.goal_position)
    draw.line((flag_x, flag_y, flag_x, flag_y - 50), fill=INK, width=2)
    draw.polygon([(flag_x, flag_y - 50), (flag_x, flag_y - 40), (flag_x + 25, flag_y - 45)], fill=(204, 204, 0))
    tilt = -math.atan(math.cos(3 * state[0]) * 3 * 0.45)  # the slope's angle in the image (y down)
    base = point(float(state[0]), 10)
    body = _bar((base[0] - 20 * math.cos(tilt), base[1] - 20 * math.sin(tilt)), tilt, 40, 20)
    draw.polygon(body, fill=INK)
    for offset in (-12, 12):
        _dot(draw, (base[0] + offset * math.cos(tilt), base[1] + offset * math.sin(tilt) + 8), 5, (128, 128, 128))
    return np.asarray(image)


_DRAWERS = {
    "CartPoleEnv": _cartpole,
    "PendulumEnv": _pendulum,
    "AcrobotEnv": _acrobot,
    "MountainCarEnv": _mountain_car,
    "Continuous_MountainCarEnv": _mountain_car,
}
