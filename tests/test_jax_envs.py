"""JAX engine environments: auto-reset inside the step, terminated and truncated kept apart,
the torch VecEnv wrapper used by eval/play, task names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("gymnax")
import jax.numpy as jnp  # noqa: E402

from ddprl.errors import UsageError  # noqa: E402
from ddprl.jax.envs import check_task, make_jax_env, parse_task  # noqa: E402
from ddprl.jax.vec import JaxVecEnv  # noqa: E402


def rollout(env, steps, num_envs=3, action=None, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), num_envs)
    state, obs = jax.jit(jax.vmap(env.reset))(keys)
    step = jax.jit(jax.vmap(env.step))
    out = []
    for t in range(steps):
        a = (
            action
            if action is not None
            else (jnp.zeros(num_envs, jnp.int32) if env.discrete else jnp.zeros((num_envs, env.action_dim)))
        )
        prev = obs
        state, obs, reward, terminated, truncated, final_obs = step(
            jax.random.split(jax.random.PRNGKey(t), num_envs), state, a
        )
        out.append(
            {
                "prev": np.asarray(prev),
                "obs": np.asarray(obs),
                "reward": np.asarray(reward),
                "terminated": np.asarray(terminated),
                "truncated": np.asarray(truncated),
                "final_obs": np.asarray(final_obs),
            }
        )
    return out


def test_gymnax_time_limit_is_truncation_and_resets_in_the_step():
    env = make_jax_env("gymnax/Pendulum-v1", max_steps_in_episode=4)  # Pendulum never terminates
    steps = rollout(env, 9)
    ends = [s["truncated"].all() for s in steps]
    assert ends == [False, False, False, True, False, False, False, True, False]
    assert not any(s["terminated"].any() for s in steps)
    end = steps[3]
    # obs is already the next episode's first observation; final_obs the true last one
    assert not np.allclose(end["obs"], end["final_obs"])
    assert np.allclose(steps[2]["obs"], steps[3]["prev"])


def test_gymnax_failure_is_termination_without_truncation():
    env = make_jax_env("gymnax/CartPole-v1")
    steps = rollout(env, 60)  # always pushing left: the pole falls within a few dozen steps
    first_end = next(i for i, s in enumerate(steps) if s["terminated"].any())
    assert first_end < 59 and not any(s["truncated"].any() for s in steps)
    env_i = int(np.argmax(steps[first_end]["terminated"]))
    assert abs(steps[first_end]["final_obs"][env_i][2]) > 0.2  # the pole angle past the threshold
    assert abs(steps[first_end]["obs"][env_i][2]) < 0.06  # a fresh episode


def test_gymnax_state_index_observations_are_one_hot():
    """FrozenLake-misc observes its cell as an index: the network sees a one-hot of 16, as the
    torch engine's FrozenLake-v1 does."""
    steps = rollout(make_jax_env("gymnax/FrozenLake-misc"), 3)
    for s in steps:
        assert s["obs"].shape[-1] == 16 and s["final_obs"].shape[-1] == 16
        assert np.array_equal(s["obs"].sum(-1), np.ones(s["obs"].shape[:-1]))


@pytest.mark.slow
def test_brax_time_limit_and_continuous_actions():
    # The adapter does not depend on brax's physics pipeline: the quick-to-compile "spring" one
    # here (MJX, the default, is compiled by tests/test_jax_engine.py's brax run).
    env = make_jax_env("brax/inverted_pendulum", backend="spring", episode_length=3)
    assert not env.discrete and env.action_dim == 1 and env.obs_shape == (4,)
    steps = rollout(env, 4, num_envs=2)
    assert [bool(s["truncated"].all()) for s in steps] == [False, False, True, False]
    assert steps[2]["reward"].dtype == np.float32


def test_vec_env_wrapper_reports_episodes_like_the_torch_envs():
    env = JaxVecEnv(make_jax_env("gymnax/Pendulum-v1", max_steps_in_episode=3), num_envs=2, seed=5)
    obs = env.reset(seed=5)
    assert obs.shape == (2, 3) and obs.dtype == torch.float32
    again = JaxVecEnv(make_jax_env("gymnax/Pendulum-v1"), num_envs=2).reset(seed=5)
    assert torch.equal(obs, again)  # seeded by seed + i
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 1))
    assert truncated.all() and not terminated.any()
    assert torch.equal(info["episode_length"], torch.tensor([3, 3]))
    assert info["episode_return"].shape == (2,) and (info["episode_return"] < 0).all()
    frame = env.render_rgb()
    assert frame.ndim == 3 and frame.shape[2] == 3


@pytest.mark.parametrize(
    "task,family", [("gymnax/Acrobot-v1", "gymnax"), ("CartPole-v1", "gymnax"), ("brax/ant", "brax")]
)
def test_task_names(task, family):
    assert parse_task(task)[0] == family
    check_task(task)


def test_task_names_are_gymnax_s_own():
    import gymnax

    from ddprl.jax.envs import GYMNAX_IDS

    assert tuple(gymnax.registered_envs) == GYMNAX_IDS


def test_unknown_task_names_near_matches():
    with pytest.raises(UsageError, match=r"did you mean gymnax/Breakout-MinAtar"):
        check_task("gymnax/Breakout-Minatar")
    with pytest.raises(UsageError, match=r"unknown brax task 'brax/hopr'.*did you mean brax/hopper"):
        check_task("brax/hopr")


@pytest.mark.parametrize(
    "task",
    [
        "gymnax/Acrobot-v1",
        "gymnax/MountainCar-v0",
        "gymnax/MountainCarContinuous-v0",
        "gymnax/Breakout-MinAtar",
        "gymnax/Pendulum-v1",
    ],
)
def test_the_issue_s_gymnax_families_step(task):
    env = make_jax_env(task)
    steps = rollout(env, 3, num_envs=2)
    assert steps[-1]["obs"].shape == (2, *env.obs_shape) and steps[-1]["obs"].dtype == np.float32
    assert steps[-1]["reward"].shape == (2,) and np.isfinite(steps[-1]["reward"]).all()
    assert env.discrete == (task not in ("gymnax/MountainCarContinuous-v0", "gymnax/Pendulum-v1"))
