"""Gymnasium's MuJoCo tasks (HalfCheetah, Hopper, Walker2d, Ant, Humanoid, ...) on EnvPool, behind
ddprl's ``VecEnv`` contract (``env_backend=envpool``).

EnvPool 1.2.5 ports every Gymnasium MuJoCo task as ``-v4`` and ``-v5`` (and some as v2 or v3,
which Gymnasium runs only with the retired mujoco-py). ddprl takes v4 and v5, under Gymnasium's
names: ``task=HalfCheetah-v5 env_backend=envpool`` is the task ``env_backend=gymnasium`` runs. From
one state the same actions give both back-ends the same observations, rewards, terminations
and time limits, up to float rounding (tests/test_envpool_mujoco.py); for that EnvPool's v4 envs
compute contact forces after each step (``post_constraint``) as Gymnasium 1.x's v4 do (Humanoid's
``cfrc_ext`` observations are zeros otherwise). What differs: a seed starts other episodes
(EnvPool draws with its own generator; env ``i`` still gets ``seed + i``, ranks apart as ever), a
resumed run starts new episodes (no simulator state to save), and frames (``ddprl play``,
videos) come from Gymnasium's renderer on the same task, since EnvPool's needs an OpenGL context
ddprl does not make. ``env_backend=auto`` keeps Gymnasium for MuJoCo.

``env_kwargs`` takes the keywords both back-ends know under one name (``reset_noise_scale``,
``ctrl_cost_weight``, ...) and ``max_episode_steps``.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ddprl.envs.atari import import_envpool
from ddprl.errors import UsageError

# Gymnasium's MuJoCo tasks EnvPool ports, and the versions of them ddprl runs on EnvPool.
TASKS = (
    "Ant HalfCheetah Hopper Humanoid HumanoidStandup InvertedDoublePendulum InvertedPendulum "
    "Pusher Reacher Swimmer Walker2d"
).split()
VERSIONS = ("v4", "v5")
INSTALL = "pip install envpool==1.2.5"
# EnvPool's own settings (the pool, its seeds, its renderer), never an env_kwarg.
_RESERVED = {
    "num_envs",
    "batch_size",
    "num_threads",
    "max_num_players",
    "thread_affinity_offset",
    "base_path",
    "seed",
    "env_seed",
    "gym_reset_return_info",
    "post_constraint",
    "gymnasium_v5_render_camera",
    "frame_stack",
    "reward_threshold",
    "xml_file",  # a path in EnvPool's assets, not Gymnasium's
}


def mujoco_task(task: Any) -> tuple[str, str] | None:
    """``(name, version)`` of a Gymnasium MuJoCo task EnvPool has a port of, any version, else None.

    >>> mujoco_task("HalfCheetah-v4"), mujoco_task("HalfCheetah-v2"), mujoco_task("CartPole-v1")
    (('HalfCheetah', 'v4'), ('HalfCheetah', 'v2'), None)
    """
    name, _, version = str(task).rpartition("-")
    if name not in TASKS or not version.startswith("v") or not version[1:].isdigit():
        return None
    return name, version


def check_envpool(task: str) -> None:
    """A UsageError of one line when ``task`` cannot run with ``env_backend=envpool``: a version
    other than v4 and v5, or EnvPool missing."""
    name, version = mujoco_task(task) or (task, "")
    if version not in VERSIONS:
        raise UsageError(
            f"task={task} env_backend=envpool: ddprl runs {name} on EnvPool as {name}-v4 or {name}-v5 "
            f"(Gymnasium's versions); use task={name}-v5 or env_backend=gymnasium"
        )
    if importlib.util.find_spec("envpool") is None:
        raise UsageError(f"task={task} env_backend=envpool needs EnvPool (missing: envpool); {INSTALL}")


def uses_envpool(task: str, backend: str) -> bool:
    """Whether ``task`` runs on EnvPool: a MuJoCo task with ``env_backend=envpool`` (auto: Gymnasium)."""
    return backend == "envpool" and mujoco_task(task) is not None


def kwarg_names(task: str) -> list[str]:
    """The ``env_kwargs`` ``task`` takes on EnvPool: EnvPool's settings Gymnasium's constructor of
    the task names alike (one meaning on both back-ends), and ``max_episode_steps``."""
    from ddprl.envs.gym_vec import env_creator

    ours = set(import_envpool().make_spec(task).config._fields) - _RESERVED
    params = inspect.signature(env_creator(task)).parameters
    return sorted(ours & set(params)) + ["max_episode_steps"]


class EnvPoolMujocoVecEnv:
    """``num_envs`` envs of a Gymnasium MuJoCo ``task`` (v4, v5) in one EnvPool, as torch tensors on
    ``device`` (see ``envs/base.py``); env ``i`` seeded ``seed + i``.

    EnvPool resets an env in the call after its episode ended (that call's action ignored,
    reward 0). :meth:`step` makes that call at once for the envs that ended, so that the
    observation it returns is the next episode's first and ``info["final_obs"]`` the ended one's
    last, as Gymnasium's same-step autoreset. Actions are clipped to the action box, as
    :class:`~ddprl.envs.gym_vec.GymVecEnv` clips them.

    >>> env = EnvPoolMujocoVecEnv("HalfCheetah-v4", num_envs=2, seed=0)   # doctest: +SKIP
    >>> env.reset().shape                                                # doctest: +SKIP
    torch.Size([2, 17])
    """

    backend = "envpool"
    extra_info_keys = ()

    def __init__(
        self,
        task: str,
        num_envs: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        **env_kwargs: Any,
    ):
        check_envpool(task)
        takes = kwarg_names(task)
        for key in env_kwargs:
            if key not in takes:  # make_env turns this into a UsageError naming what the task takes
                raise TypeError(f"EnvPoolMujocoVecEnv() got an unexpected keyword argument '{key}'")
        self.task, self.num_envs, self.device = task, num_envs, torch.device(device)
        self._kwargs = {
            "num_envs": num_envs,
            # One worker thread: a MuJoCo step takes tens of microseconds, 8 HalfCheetahs stepped no faster on
            # two threads than on one (2-core AMD EPYC), and a rank's other cores are its peers'.
            "num_threads": 1,
            "post_constraint": True,  # contact forces as Gymnasium 1.x computes them for v4 too
            **env_kwargs,
        }
        self._pool = self._make(seed)
        self.seed, self.fresh = seed, True  # fresh: not stepped since made with these seeds
        obs_space, act_space = self._pool.observation_space, self._pool.action_space
        # Gymnasium's spaces for the task: float64 observations (float32 tensors here), float32 actions.
        self.single_observation_space = gym.spaces.Box(obs_space.low, obs_space.high, obs_space.shape, np.float64)
        self.single_action_space = gym.spaces.Box(
            act_space.low.astype(np.float32), act_space.high.astype(np.float32), act_space.shape, np.float32
        )
        self._low = self.single_action_space.low.astype(np.float64)
        self._high = self.single_action_space.high.astype(np.float64)
        self._episode_return = np.zeros(num_envs, np.float64)
        self._episode_length = np.zeros(num_envs, np.int64)

    def _make(self, seed: int) -> Any:
        envpool = import_envpool()
        # EnvPool seeds are int32; derived ddprl seeds lie just below 2^31.
        seeds = [(seed + i) % 2**31 for i in range(self.num_envs)]
        return envpool.make(self.task, env_type="gymnasium", seed=seeds, **self._kwargs)

    def _tensor(self, x: np.ndarray, dtype: type = np.float32) -> torch.Tensor:
        t = torch.from_numpy(np.asarray(x, dtype=dtype))
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every episode anew; env ``i`` seeded ``seed + i`` (default: the env's seed)."""
        seed = self.seed if seed is None else seed
        if not (self.fresh and seed == self.seed):  # EnvPool takes its seeds when it is made
            self._pool.close()
            self._pool, self.seed = self._make(seed), seed
        self.fresh = False
        obs, info = self._pool.reset()
        self._episode_return[:] = 0
        self._episode_length[:] = 0
        return self._tensor(obs[np.argsort(info["env_id"])])

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.fresh = False
        # The policy's Gaussian is unbounded; the env sees actions clipped to its box (float64: EnvPool's).
        act = np.clip(actions.detach().cpu().numpy().astype(np.float64), self._low, self._high)
        obs, reward, terminated, truncated, info = self._pool.step(act)
        order = np.argsort(info["env_id"])
        obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
        self._episode_return += reward
        self._episode_length += 1
        done = terminated | truncated
        final_obs = obs
        if done.any():
            ended = np.flatnonzero(done)
            final_obs = obs.copy()
            # The call that resets the ended envs (its zero actions ignored): their next first observations.
            zeros = np.zeros((len(ended), *self._low.shape), np.float64)
            next_obs, *_, next_info = self._pool.step(zeros, ended.astype(np.int32))
            obs[ended] = next_obs[np.argsort(next_info["env_id"])]
        out_info = {
            "final_obs": self._tensor(final_obs),
            # copies (astype copies): the counters are zeroed below where an episode ended
            "episode_return": self._tensor(self._episode_return.astype(np.float32)),
            "episode_length": self._tensor(self._episode_length.copy(), np.int64),
        }
        self._episode_return[done] = 0
        self._episode_length[done] = 0
        return (
            self._tensor(obs),
            self._tensor(reward),
            self._tensor(terminated, np.bool_),
            self._tensor(truncated, np.bool_),
            out_info,
        )

    def render_rgb(self, i: int = 0) -> np.ndarray:
        raise UsageError(
            f"{self.task} on EnvPool draws no frames: make the env inside ddprl.envs.rendering('rgb_array'), "
            "which draws it with Gymnasium"
        )

    def state_dict(self) -> None:
        """No exact resume: EnvPool keeps the simulator's state to itself, a resumed run starts new episodes."""
        return None

    def close(self) -> None:
        self._pool.close()
