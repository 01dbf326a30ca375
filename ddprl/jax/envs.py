"""Environments of the JAX engine: pure functions of one env, vectorised and sharded by the engine.

A :class:`JaxEnv` gives ``reset(key) -> (state, obs)`` and ``step(key, state, action) ->
(state, obs, reward, terminated, truncated, final_obs)`` for ONE environment; the engine
``vmap``\\ s them over a device's envs and ``shard_map``\\ s over devices, so the whole
rollout compiles into one program and the env state never leaves its device. ``step``
auto-resets inside the compiled step: where an episode ended, ``obs`` is already the next
episode's first observation and ``final_obs`` the true last one (bootstrapped on truncation).
Terminated and truncated are kept apart, as in ddprl's torch ``VecEnv`` contract.

Task names: ``gymnax/<id>`` (CartPole-v1, Acrobot-v1, Pendulum-v1, MountainCar-v0,
MountainCarContinuous-v0, Breakout-MinAtar, ...; a bare gymnax id works too) and
``brax/<env>`` (ant, humanoid, halfcheetah, hopper, walker2d, ...; MuJoCo physics through MJX
by default, ``env_kwargs={backend: positional}`` for another brax pipeline).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import numpy as np

from ddprl.errors import UsageError

BRAX_EPISODE_STEPS = 1000  # brax's training default: locomotion episodes are cut at 1,000 steps


@dataclasses.dataclass(frozen=True)
class JaxEnv:
    """One environment as pure functions (see the module docstring)."""

    task: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int  # number of actions (discrete) or action dimensions (continuous)
    action_low: np.ndarray | None  # continuous bounds (actions are clipped to them before a step)
    action_high: np.ndarray | None
    max_episode_steps: int
    reset: Callable[[Any], tuple[Any, Any]]
    step: Callable[[Any, Any, Any], tuple[Any, Any, Any, Any, Any, Any]]
    # frame of one env's state (host side, for `ddprl play ... video=`); None: cannot render
    render: Callable[[Any], np.ndarray] | None = None
    # whether its code passes shard_map's replication check (check_vma); MJX's does not
    check_vma: bool = True


# gymnax 1.0.1's registered ids (the `jax` extra pins that version; a test compares). Written out
# so that checking a task name never imports gymnax: its import starts JAX's backend, which
# must wait for jax.distributed.initialize when this process is one of several (torchrun, srun).
GYMNAX_IDS = (
    "CartPole-v1",
    "Pendulum-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Catch-bsuite",
    "DeepSea-bsuite",
    "MemoryChain-bsuite",
    "UmbrellaChain-bsuite",
    "DiscountingChain-bsuite",
    "MNISTBandit-bsuite",
    "SimpleBandit-bsuite",
    "FourRooms-misc",
    "MetaMaze-misc",
    "PointRobot-misc",
    "BernoulliBandit-misc",
    "GaussianBandit-misc",
    "Reacher-misc",
    "Swimmer-misc",
    "Pong-misc",
    "FrozenLake-misc",
)


def gymnax_ids() -> list[str]:
    return list(GYMNAX_IDS)


BRAX_ENVS = (
    "ant",
    "halfcheetah",
    "hopper",
    "humanoid",
    "humanoidstandup",
    "inverted_double_pendulum",
    "inverted_pendulum",
    "pusher",
    "reacher",
    "swimmer",
    "walker2d",
)


def parse_task(task: str) -> tuple[str, str]:
    """``gymnax/CartPole-v1`` → ("gymnax", "CartPole-v1"); a bare gymnax id counts as gymnax."""
    family, slash, name = task.partition("/")
    if slash and family in ("gymnax", "brax"):
        return family, name
    return "gymnax", task


def check_task(task: str) -> None:
    """A UsageError with near matches for a task the JAX engine does not know."""
    family, name = parse_task(task)
    if family == "brax":
        if name not in BRAX_ENVS:
            near = difflib.get_close_matches(name, BRAX_ENVS, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join('brax/' + n for n in near)}?)" if near else ""
            raise UsageError(f"unknown brax task {task!r}{hint}; brax tasks: {', '.join(BRAX_ENVS)}")
        return
    ids = gymnax_ids()
    if name not in ids:
        near = difflib.get_close_matches(name, ids, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join('gymnax/' + n for n in near)}?)" if near else ""
        raise UsageError(
            f"unknown task {task!r} for engine=jax{hint}; use gymnax/<id> (gymnax ids: "
            f"{', '.join(ids[:8])}, ...) or brax/<env> ({', '.join(BRAX_ENVS[:5])}, ...)"
        )


def make_jax_env(task: str, **kwargs: Any) -> JaxEnv:
    """The :class:`JaxEnv` of ``task`` (``kwargs``: the env's own options, ``env_kwargs``)."""
    check_task(task)
    family, name = parse_task(task)
    return _brax(task, name, **kwargs) if family == "brax" else _gymnax(task, name, **kwargs)


def _gymnax(task: str, name: str, **kwargs: Any) -> JaxEnv:
    import gymnax
    import jax
    import jax.numpy as jnp
    from gymnax.environments import spaces

    env, params = gymnax.make(name)
    if kwargs:
        fields = {f.name for f in dataclasses.fields(params)}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise UsageError(f"env_kwargs {unknown} are not parameters of {task}; it has: {', '.join(sorted(fields))}")
        params = params.replace(**kwargs)
    obs_space, act_space = env.observation_space(params), env.action_space(params)
    if isinstance(obs_space, spaces.Discrete):  # a state index (FrozenLake-misc): one-hot, as the torch engine's
        n_states = int(obs_space.n)
        obs_shape: tuple[int, ...] = (n_states,)

        def encode(obs: Any) -> Any:
            return jax.nn.one_hot(obs, n_states, dtype=jnp.float32)

    else:
        obs_shape = tuple(int(s) for s in obs_space.shape)

        def encode(obs: Any) -> Any:
            return jnp.asarray(obs, jnp.float32)

    discrete = isinstance(act_space, spaces.Discrete)
    low = high = None
    if discrete:
        action_dim = int(act_space.n)
    else:
        action_dim = int(np.prod(act_space.shape)) if act_space.shape else 1
        low = np.broadcast_to(np.asarray(act_space.low, np.float32), (action_dim,)).copy()
        high = np.broadcast_to(np.asarray(act_space.high, np.float32), (action_dim,)).copy()

    def reset(key):
        obs, state = env.reset(key, params)
        return state, encode(obs)

    def step(key, state, action):
        if not discrete and not act_space.shape:  # scalar-action envs (Pendulum) take a scalar
            action = action[0]
        obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)
        terminated = jnp.asarray(terminated, bool)
        # A terminal state at the time limit is a termination (no bootstrap), as in Gymnasium.
        truncated = jnp.asarray(truncated, bool) & ~terminated
        return (
            state,
            encode(obs),
            jnp.asarray(reward, jnp.float32),
            terminated,
            truncated,
            encode(info["final_observation"]),
        )

    return JaxEnv(
        task,
        obs_shape,
        discrete,
        action_dim,
        low,
        high,
        int(params.max_steps_in_episode),
        reset,
        step,
        _gymnax_renderer(name, env, params),
    )


def _gymnax_renderer(name: str, env: Any, params: Any) -> Callable[[Any], np.ndarray] | None:
    """Frames for gymnax classic control drawn by Gymnasium's own renderer from the same physics state
    (by ``ddprl.envs.classic_pictures`` where pygame is missing);
    the other tasks with a scene by ``ddprl.jax.pictures``."""
    mapping = {
        "CartPole-v1": ("CartPole-v1", lambda s: [s.x, s.x_dot, s.theta, s.theta_dot]),
        "Pendulum-v1": ("Pendulum-v1", lambda s: [s.theta, s.theta_dot]),
        "Acrobot-v1": ("Acrobot-v1", lambda s: [s.joint_angle1, s.joint_angle2, s.velocity_1, s.velocity_2]),
        "MountainCar-v0": ("MountainCar-v0", lambda s: [s.position, s.velocity]),
        "MountainCarContinuous-v0": ("MountainCarContinuous-v0", lambda s: [s.position, s.velocity]),
    }
    if name not in mapping:
        from ddprl.jax.pictures import gymnax_picture

        return gymnax_picture(name, env, params)
    gym_id, to_state = mapping[name]
    holder: dict[str, Any] = {}

    def render(state: Any) -> np.ndarray:
        import gymnasium as gym

        from ddprl.envs.classic_pictures import classic_picture, pygame_available

        if "env" not in holder:
            holder["env"] = gym.make(gym_id, render_mode="rgb_array")
            holder["env"].reset(seed=0)
        inner = holder["env"].unwrapped
        inner.state = np.array([float(v) for v in to_state(state)], dtype=np.float64)
        if name == "Pendulum-v1":
            inner.last_u = None
        if not pygame_available():
            return classic_picture(inner)
        return np.asarray(holder["env"].render())

    return render


def _brax(
    task: str, name: str, backend: str = "mjx", episode_length: int = BRAX_EPISODE_STEPS, **kwargs: Any
) -> JaxEnv:
    import jax
    import jax.numpy as jnp
    from brax import envs as brax_envs

    try:
        env = brax_envs.get_environment(name, backend=backend, **kwargs)
    except TypeError as e:
        raise UsageError(f"env_kwargs for {task}: {e}") from None

    def arrays(state):  # some envs keep python floats (reward, done) in their state
        return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32) if isinstance(x, (float, int)) else x, state)

    def reset(key):
        first = arrays(env.reset(key))
        # brax's own auto-reset habit: an ended episode restarts from its env's first state
        # (kept in the state), so the step never pays for a reset computation.
        return {"env": first, "first": first, "steps": jnp.zeros((), jnp.int32)}, first.obs

    def step(key, state, action):
        del key  # brax physics is deterministic
        nxt = arrays(env.step(state["env"], action))
        steps = state["steps"] + 1
        terminated = nxt.done > 0
        truncated = (steps >= episode_length) & ~terminated
        done = terminated | truncated
        restart = jax.tree.map(lambda f, n: jnp.where(done, f, n), state["first"], nxt)
        new_state = {"env": restart, "first": state["first"], "steps": jnp.where(done, 0, steps)}
        return new_state, restart.obs, nxt.reward.astype(jnp.float32), terminated, truncated, nxt.obs

    action_dim = int(env.action_size)
    ones = np.ones(action_dim, np.float32)

    def render(state: Any) -> np.ndarray:
        return np.asarray(env.render([state["env"].pipeline_state], height=240, width=320)[0])

    return JaxEnv(
        task,
        (int(env.observation_size),),
        False,
        action_dim,
        -ones,
        ones,
        episode_length,
        reset,
        step,
        render,
        check_vma=False,
    )
