"""Classic control drawn with Pillow (the base install has no pygame): Gymnasium's frame sizes, and
the picture follows the physics state."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from ddprl.envs import classic_pictures
from ddprl.envs.classic_pictures import classic_picture
from ddprl.envs.gym_vec import GymVecEnv

POLE = (202, 152, 101)


def _columns_of(frame: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.nonzero((frame == colour).all(-1).any(0))[0]


@pytest.mark.parametrize(
    "task, shape",
    [
        ("CartPole-v1", (400, 600, 3)),
        ("Pendulum-v1", (500, 500, 3)),
        ("Acrobot-v1", (500, 500, 3)),
        ("MountainCar-v0", (400, 600, 3)),
        ("MountainCarContinuous-v0", (400, 600, 3)),
    ],
)
def test_each_task_draws_its_state_at_gymnasiums_size(task, shape):
    env = gym.make(task)
    assert classic_picture(env) is None  # no state before the first reset
    env.reset(seed=0)
    first = classic_picture(env)
    assert first.shape == shape and first.dtype == np.uint8
    assert len(np.unique(first.reshape(-1, 3), axis=0)) >= 3
    inner = env.unwrapped
    inner.state = np.asarray(inner.state, np.float64) + 0.5  # another state, another picture
    assert not np.array_equal(classic_picture(env), first)
    env.close()


def test_the_pole_leans_the_way_theta_says_and_the_cart_moves_with_x():
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    inner = env.unwrapped
    inner.state = np.array([0.0, 0.0, 0.3, 0.0])  # positive theta: leaning right
    right = _columns_of(classic_picture(env), POLE)
    inner.state = np.array([0.0, 0.0, -0.3, 0.0])
    left = _columns_of(classic_picture(env), POLE)
    assert right.mean() > 300 > left.mean()
    inner.state = np.array([1.2, 0.0, 0.0, 0.0])  # x = half the track's right half: 300 + 1.2 * 125
    assert abs(_columns_of(classic_picture(env), POLE).mean() - 450) < 6
    assert classic_picture(object()) is None  # not classic control


def test_video_frames_without_pygame_come_from_pillow(monkeypatch):
    monkeypatch.setattr("ddprl.envs.gym_vec.pygame_available", lambda: False)
    env = GymVecEnv("CartPole-v1", num_envs=1, seed=3, frames="rgb_array")
    env.reset(seed=3)
    frame = env.render_rgb()
    assert np.array_equal(frame, classic_pictures.classic_picture(env.envs.envs[0]))
    env.close()
