"""DeepMind Control Suite behind ddprl's VecEnv contract (envs/base.py; docs/references.md#deepmind-control).

Checks the protocol TD-MPC2's published numbers rely on: flattened float32 state, action
repeat 2 with summed rewards, 500 agent steps ending *truncated*, actions in [-1, 1] mapped
onto the task's bounds, distinct seeds per rank, and errors a user can act on.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("dm_control")
from dm_control import suite  # noqa: E402

from ddprl.envs import check_task, env_seed, make_env  # noqa: E402
from ddprl.envs.dmc import DMC_TASKS, DMCVecEnv, dmc_task_names, parse_dmc_task  # noqa: E402
from ddprl.errors import UsageError  # noqa: E402


def test_static_task_list_matches_installed_suite():
    # check_task knows DMC names without importing dm_control; the list must stay the suite's
    assert DMC_TASKS == frozenset(suite.ALL_TASKS)
    assert set(suite.BENCHMARKING) <= DMC_TASKS


def test_task_names_and_aliases():
    assert parse_dmc_task("walker-run") == ("walker", "run")
    assert parse_dmc_task("cup-catch") == ("ball_in_cup", "catch")
    assert parse_dmc_task("ball_in_cup-catch") == ("ball_in_cup", "catch")
    assert parse_dmc_task("pointmass-easy") == ("point_mass", "easy")
    assert parse_dmc_task("cartpole-swingup_sparse") == ("cartpole", "swingup_sparse")
    assert parse_dmc_task("humanoid_CMU-walk") == ("humanoid_CMU", "walk")
    assert parse_dmc_task("HalfCheetah-v5") is None and parse_dmc_task("walker") is None
    assert {"dog-run", "cup-catch", "pointmass-easy", "humanoid-walk"} <= set(dmc_task_names())
    for name in ("dog-run", "humanoid-walk", "cup-catch", "pointmass-easy", "CartPole-v1"):
        check_task(name)


def test_unknown_dmc_task_lists_the_domain_tasks():
    with pytest.raises(UsageError, match="walker tasks: walker-run, walker-stand, walker-walk"):
        check_task("walker-sprint")
    with pytest.raises(UsageError, match="did you mean walker-run"):
        check_task("walkr-run")


def test_missing_dm_control_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "dm_control", None)  # import dm_control now raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'ddprl\[dmc\]'"):
        check_task("walker-run")
    with pytest.raises(UsageError, match="dm-control"):
        make_env("walker-run", 1, seed=0)


def test_contract_shapes_dtypes_and_spaces():
    env = make_env("walker-run", 3, seed=0)
    assert isinstance(env, DMCVecEnv)
    obs = env.reset()
    assert obs.shape == (3, 24) and obs.dtype == torch.float32  # orientations 14 + height 1 + velocity 9
    assert env.single_observation_space.shape == (24,) and env.single_action_space.shape == (6,)
    assert (env.single_action_space.low == -1).all() and (env.single_action_space.high == 1).all()
    obs, reward, terminated, truncated, info = env.step(torch.zeros(3, 6))
    assert obs.shape == (3, 24) and reward.shape == (3,) and reward.dtype == torch.float32
    assert terminated.dtype == truncated.dtype == torch.bool
    assert info["final_obs"].shape == (3, 24)
    assert info["episode_length"].dtype == torch.int64 and (info["episode_length"] == 1).all()
    assert env.state_dict() is None
    env.close()


def _flat(observation) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1) for v in observation.values()])


def test_action_repeat_sums_two_simulator_steps():
    env = DMCVecEnv("cheetah-run", 1, seed=3)
    raw = suite.load("cheetah", "run", task_kwargs={"random": 3, "time_limit": float("inf")})
    np.testing.assert_allclose(env.reset().numpy()[0], _flat(raw.reset().observation))
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = torch.rand(1, 6, generator=g) * 2 - 1
        obs, reward, *_ = env.step(a)
        r1 = raw.step(a[0].numpy().astype(np.float64))
        r2 = raw.step(a[0].numpy().astype(np.float64))
        np.testing.assert_allclose(obs.numpy()[0], _flat(r2.observation), rtol=1e-6, atol=1e-6)
        assert reward.item() == pytest.approx(r1.reward + r2.reward, rel=1e-5, abs=1e-6)


def test_episodes_are_500_agent_steps_and_truncated():
    env = DMCVecEnv("cartpole-balance", 2, seed=0)
    env.reset()
    rewards = torch.zeros(2)
    for t in range(1, 501):
        obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 1))
        rewards += reward
        assert not terminated.any()  # a time limit is no terminal state: bootstrap through it
        assert bool(truncated.all()) == (t == 500)
    assert (info["episode_length"] == 500).all()
    torch.testing.assert_close(info["episode_return"], rewards)
    assert rewards.min() > 500  # balance keeps the pole up for a while with zero force: reward per agent step <= 2
    assert not torch.equal(info["final_obs"], obs)  # same-step autoreset: obs opens the next episode
    obs, _, _, truncated, info = env.step(torch.zeros(2, 1))
    assert not truncated.any() and (info["episode_length"] == 1).all()
    short = DMCVecEnv("cartpole-balance", 1, seed=0, episode_length=7)
    short.reset()
    ends = [bool(short.step(torch.zeros(1, 1))[3]) for _ in range(14)]
    assert [i + 1 for i, e in enumerate(ends) if e] == [7, 14]


def test_seeds_distinct_per_rank_and_reproducible():
    # rank r's env i is seeded seed + r*10000 + i (docs/distributed.md, invariant 3)
    obs_r0 = make_env("walker-walk", 2, seed=env_seed(1, 0)).reset()
    obs_r1 = make_env("walker-walk", 2, seed=env_seed(1, 1)).reset()
    assert not torch.allclose(obs_r0[0], obs_r0[1])  # two envs of one rank differ
    assert not torch.allclose(obs_r0, obs_r1)  # and so do two ranks
    torch.testing.assert_close(make_env("walker-walk", 2, seed=env_seed(1, 1)).reset(), obs_r1)
    env = make_env("walker-walk", 2, seed=5)
    first = env.reset(seed=123)
    env.step(torch.ones(2, 6))
    torch.testing.assert_close(env.reset(seed=123), first)  # reset(seed) reseeds every env


def test_actions_rescaled_to_task_bounds():
    env = DMCVecEnv("quadruped-walk", 1, seed=0)  # bounds differ per actuator (upper 1.1 on some)
    spec = env.envs[0].action_spec()
    assert not np.allclose(spec.maximum, 1.0)
    env.reset()
    env.step(torch.ones(1, 12))
    np.testing.assert_allclose(env.envs[0].physics.data.ctrl, spec.maximum, rtol=1e-6)
    env.step(-torch.ones(1, 12) * 5)  # out-of-range actions are clipped to [-1, 1] first
    np.testing.assert_allclose(env.envs[0].physics.data.ctrl, spec.minimum, rtol=1e-6)


def _run_with_gl(code: str, gl: str) -> subprocess.CompletedProcess:
    """``code`` after making a reset cartpole-balance ``env``, in a process with MUJOCO_GL=gl
    (the OpenGL backend is chosen when mujoco is first imported)."""
    prelude = "from ddprl.envs import make_env\nenv = make_env('cartpole-balance', 1, seed=0); env.reset()\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        env={**os.environ, "MUJOCO_GL": gl},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_render_rgb_error_names_mujoco_gl():
    out = _run_with_gl(
        "from ddprl.errors import UsageError\n"
        "try:\n    env.render_rgb()\nexcept UsageError as e:\n    print('USAGE', e)\n",
        "disable",
    )
    assert "USAGE cannot render cartpole-balance with MUJOCO_GL=disable" in out.stdout, out.stderr[-2000:]
    assert "MUJOCO_GL=egl" in out.stdout


@pytest.mark.slow
def test_render_rgb_frame_with_egl():
    out = _run_with_gl(
        "f = env.render_rgb(height=48, width=64)\nprint('FRAME', f.shape, f.dtype, int(f.std() > 5))\n", "egl"
    )
    if "FRAME" not in out.stdout:
        pytest.skip(f"no EGL rendering on this machine: {out.stderr.strip().splitlines()[-1:]}")
    assert "FRAME (48, 64, 3) uint8 1" in out.stdout
