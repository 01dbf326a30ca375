"""``make_env``: one rank's vectorised environment, whatever the task's origin."""

from __future__ import annotations

import contextlib
import difflib
import inspect
import re
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import torch

from ddprl.envs import atari, envpool_mujoco
from ddprl.envs.base import VecEnv
from ddprl.errors import UsageError
from ddprl.runtime.seeding import env_seed

__all__ = ["make_env", "check_task", "env_spaces", "rendering", "VecEnv", "env_seed"]

# Tasks implemented by ddprl itself, on top of every registered Gymnasium id.
BUILTIN_TASKS: dict[str, str] = {"snake": "batched Snake in torch, on the rank's device (ddprl.envs.snake)"}


# The one-game numpy Snake, for comparisons through Gymnasium's vector envs (benchmarks).
if "ddprl/SnakeGym-v0" not in gym.registry:
    gym.register("ddprl/SnakeGym-v0", entry_point="ddprl.envs.snake_gym:SnakeGymEnv")


# What the envs made inside ``rendering(...)`` should draw; None everywhere else, so that
# training and evaluation envs never carry a renderer.
_render_mode: str | None = None


@contextlib.contextmanager
def rendering(mode: str) -> Iterator[None]:
    """Gymnasium envs made inside draw ``"rgb_array"`` frames (``render_rgb``) or ``"ansi"``
    text (``render_ascii``) where their task can.

    Gymnasium fixes ``render_mode`` when an env is made, and an algorithm's ``load_actor``
    makes its own envs: ``ddprl play`` and videos wrap that call in this. DMC, Snake, the
    multi-agent and JAX envs draw in any case.

    >>> with rendering("rgb_array"):                              # doctest: +SKIP
    ...     env = actor.make_env(1, seed)
    """
    global _render_mode
    previous, _render_mode = _render_mode, mode
    try:
        yield
    finally:
        _render_mode = previous


def check_task(task: str, backend: str = "auto") -> None:
    """Raise a UsageError naming near matches when ``task`` is no known environment.

    DMC names (``walker-run``, ``cup-catch``) and Atari games (``Breakout-v5``) are known
    without their packages; using one without them installed is a UsageError saying what to
    install. ``backend``: the back-end asked for (auto | envpool | gymnasium), Atari's or MuJoCo's
    (``HalfCheetah-v5 env_backend=envpool``: v4 and v5 only, EnvPool installed).
    """
    from ddprl.envs import dmc

    if dmc.parse_dmc_task(task) is not None:
        dmc.check_dmc_installed()
        return
    if atari.atari_rom(task) is not None:
        atari.check_installed(task, backend)
        return
    if envpool_mujoco.uses_envpool(task, backend):
        envpool_mujoco.check_envpool(task)
        return
    if task in BUILTIN_TASKS or task in gym.registry:
        if str(getattr(gym.registry.get(task), "entry_point", "")).startswith("gymnasium.envs.mujoco"):
            from ddprl.envs.mujoco_gl import import_mujoco

            with contextlib.suppress(ImportError):  # not installed: Gymnasium says so as it makes the env
                import_mujoco()
        return
    if dmc.is_dmc_domain(task):
        domain = task.partition("-")[0]
        tasks = sorted(t for d, t in dmc.DMC_TASKS if d == dmc.DOMAIN_ALIASES.get(domain, domain))
        raise UsageError(
            f"unknown DeepMind Control task {task!r}; {domain} tasks: {', '.join(f'{domain}-{t}' for t in tasks)}"
        )
    names = list(BUILTIN_TASKS) + list(gym.registry) + dmc.dmc_task_names() + atari.task_names()
    near = difflib.get_close_matches(task, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UsageError(
        f"unknown task {task!r}{hint}; use a Gymnasium id such as CartPole-v1, "
        "a DeepMind Control task such as walker-run or an Atari game such as Breakout-v5"
    )


def make_env(
    task: str,
    num_envs: int,
    seed: int,
    device: str | torch.device = "cpu",
    training: bool = False,
    backend: str = "auto",
    **kwargs: Any,
) -> VecEnv:
    """``num_envs`` environments of ``task`` on ``device``; env ``i`` seeded ``seed + i``.

    Callers pass ``seed=env_seed(cfg.seed, rank)`` so ranks never share a seed. A keyword the
    environment does not take (``env_kwargs``) is a UsageError naming those it takes.
    ``training=True``: the env as a learner sees it, where that differs from how it is scored
    (Atari: a lost life ends the episode, rewards clipped to their sign); False: as it is
    scored (evaluation, play). ``backend``: auto | envpool | gymnasium for Atari games and
    Gymnasium's MuJoCo tasks (auto: EnvPool for Atari where installed, Gymnasium for MuJoCo);
    others: auto.
    """
    check_task(task, backend)
    if backend != "auto" and atari.atari_rom(task) is None and envpool_mujoco.mujoco_task(task) is None:
        raise UsageError(
            f"env_backend={backend} chooses how Atari games run; {task} has one way: use auto "
            "(MuJoCo tasks such as HalfCheetah-v5 have two as well)"
        )
    try:
        return _make_env(task, num_envs, seed, device, training, backend, **kwargs)
    except gym.error.DependencyNotInstalled as e:  # Gymnasium's own word for what to install (Box2D, MuJoCo)
        raise UsageError(f"task={task} needs a package that is not installed: {e}") from None
    except TypeError as e:
        unknown = re.search(r"unexpected keyword argument '([^']+)'", str(e))
        if unknown is None or unknown.group(1) not in kwargs:
            raise
        name, takes = unknown.group(1), env_kwarg_names(task, backend)
        near = difflib.get_close_matches(name, takes, n=2, cutoff=0.6)
        raise UsageError(
            f"env_kwargs: {task} takes no {name!r}"
            + (f" (did you mean {', '.join(near)}?)" if near else "")
            + (f"; it takes {', '.join(takes)}" if takes else "")
        ) from None


def _make_env(
    task: str, num_envs: int, seed: int, device: str | torch.device, training: bool, backend: str, **kwargs: Any
) -> VecEnv:
    from ddprl.envs import dmc

    if atari.atari_rom(task) is not None:
        return atari.AtariVecEnv(task, num_envs, seed, device, training=training, backend=backend, **kwargs)
    if dmc.parse_dmc_task(task) is not None:
        return dmc.DMCVecEnv(task, num_envs, seed=seed, device=device, **kwargs)
    if task == "snake":
        from ddprl.envs.snake import SnakeEnv

        return SnakeEnv(num_envs, device=device, seed=seed, **kwargs)
    # MuJoCo on EnvPool; its frames (play, videos) drawn by Gymnasium, the same task (envpool_mujoco's docstring).
    if envpool_mujoco.uses_envpool(task, backend) and _render_mode is None:
        return envpool_mujoco.EnvPoolMujocoVecEnv(task, num_envs, seed=seed, device=device, **kwargs)
    from ddprl.envs.gym_vec import GymVecEnv

    return GymVecEnv(task, num_envs, seed=seed, device=device, frames=_render_mode, **kwargs)


def env_spaces(task: str, backend: str = "auto", **kwargs: Any) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of ``task``, from one env made and closed on the CPU: what
    an algorithm checks in the launching process, so that a task it cannot learn (or a bad
    ``env_kwargs``) is refused before any rank starts."""
    env = make_env(task, 1, seed=0, device="cpu", backend=backend, **kwargs)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def env_kwarg_names(task: str, backend: str = "auto") -> list[str]:
    """The keywords ``env_kwargs`` may give ``task`` on ``backend`` (empty when they cannot be told)."""
    from ddprl.envs import dmc

    own: tuple[str, ...] = ("self", "task", "num_envs", "seed", "device")
    extra: list[str] = []
    try:
        if envpool_mujoco.uses_envpool(task, backend):
            return envpool_mujoco.kwarg_names(task)
        if atari.atari_rom(task) is not None:
            constructor: Any = atari.AtariVecEnv.__init__
            own += ("training", "backend", "parts", "threads_on")  # make_env's own keys; the last two: env_overlap
        elif dmc.parse_dmc_task(task) is not None:
            constructor = dmc.DMCVecEnv.__init__
        elif task == "snake":
            from ddprl.envs.snake import SnakeEnv

            constructor = SnakeEnv.__init__
        else:
            from ddprl.envs.gym_vec import env_creator

            constructor = env_creator(task)
            extra = ["max_episode_steps"]  # gym.make's own, passed to its TimeLimit wrapper
        params = inspect.signature(constructor).parameters.values()
    except Exception:  # an entry point that cannot be imported or inspected: no list, still the error
        return []
    return [
        p.name
        for p in params
        if p.name not in own and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ] + extra
