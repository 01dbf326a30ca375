"""A Gymnasium vector env behind ddprl's torch ``VecEnv`` contract (see ``envs/base.py``)."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import concatenate, create_empty_array

from ddprl.envs.classic_pictures import classic_picture, pygame_available
from ddprl.envs.flatten import FlatEncoder, unencodable
from ddprl.envs.mujoco_gl import cannot_render, reason
from ddprl.errors import UsageError


class GymVecEnv:
    """``num_envs`` copies of a ``gymnasium.make`` id stepping in this process (:class:`EnvList`).

    Tensors cross the boundary on ``device``; Gymnasium's numpy stays inside. Episode return
    and length are tracked here so every env reports them the same way.

    A Box observation arrives as it is. Discrete, MultiDiscrete, MultiBinary, Tuple and Dict
    ones arrive flat, encoded by :class:`~ddprl.envs.flatten.FlatEncoder` (one-hots and values,
    SB3's encoding): ``single_observation_space`` is then the encoded Box, the task's own is
    ``task_observation_space``, and ``norm_obs_mask`` marks the columns that came from a Box
    (None: all of them). Any other space stays ``single_observation_space`` for an algorithm's
    check to refuse by name.

    ``frames="rgb_array"`` (or ``"ansi"``) makes the envs with that ``render_mode`` when the
    task offers it, for :meth:`render_rgb` (or ``render_ascii``); a ``render_mode`` in
    ``env_kwargs`` is the user's own and stays.

    >>> env = GymVecEnv("CartPole-v1", num_envs=4, seed=0)
    >>> env.reset().shape
    torch.Size([4, 4])
    """

    def __init__(
        self,
        task: str,
        num_envs: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        frames: str | None = None,
        **env_kwargs: Any,
    ):
        self.task = task
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.seed = seed
        self.render_modes: list[str] = []  # the task's, looked up when frames are asked for
        self._frames = frames
        if frames is not None and "render_mode" not in env_kwargs:
            self.render_modes = _render_modes(task, env_kwargs)
            if frames in self.render_modes:
                env_kwargs = {**env_kwargs, "render_mode": frames}
        self.render_mode = env_kwargs.get("render_mode")
        if self.render_mode == "ansi":
            # An instance attribute, not a method: ``hasattr(env, "render_ascii")`` is how the
            # terminal player (and wrappers forwarding attributes) tell that text exists.
            self.render_ascii = self._render_text
        self.envs = EnvList(lambda: gym.make(task, **env_kwargs), num_envs)
        self.task_observation_space = self.envs.single_observation_space
        self.single_observation_space = self.task_observation_space
        self._flat: FlatEncoder | None = None
        self.norm_obs_mask: np.ndarray | None = None
        space = self.task_observation_space
        if not isinstance(space, gym.spaces.Box) and unencodable(space) is None:
            self._flat = FlatEncoder(space)
            self.single_observation_space = self._flat.observation_space
            self.norm_obs_mask = self._flat.normalized
        self.single_action_space = self.envs.single_action_space
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._obs: np.ndarray | None = None  # as the tensors hold it (encoded)

    def _encode_each(self, observations: list[Any]) -> np.ndarray:
        """One new array of single ``observations``, as the tensors hold them (encoded)."""
        if self._flat is not None:
            return self._flat.each(observations)
        space = self.task_observation_space
        if not isinstance(space, gym.spaces.Box):  # left for the algorithm's check to refuse by name
            return concatenate(space, observations, create_empty_array(space, len(observations)))
        batch = np.empty((len(observations), *space.shape), dtype=space.dtype)  # as concatenate batches a Box
        for i, obs in enumerate(observations):  # a few envs: cheaper than np.stack's generic path
            batch[i] = obs
        return batch

    def _tensor(self, x: np.ndarray, dtype: type = np.float32) -> torch.Tensor:
        # Cast in numpy and share the array: ~1 us, against ~5 us for as_tensor(x, dtype).to(device),
        # and a step converts six arrays. The same values: float64 -> float32 rounds alike in both.
        t = torch.from_numpy(np.asarray(x, dtype=dtype))
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs = self._encode_each(self.envs.reset(seed=self.seed if seed is None else seed))
        self._episode_return[:] = 0
        self._episode_length[:] = 0
        self._obs = obs
        return self._tensor(obs)

    def step(self, actions: torch.Tensor):
        if self._discrete:
            # Python ints: a Discrete space checks an int in ~1 us, a numpy integer in ~10 (np.issubdtype)
            act = actions.tolist()
        else:
            # The policy's Gaussian is unbounded; the env sees actions clipped to its box.
            act = np.clip(actions.detach().cpu().numpy(), self.single_action_space.low, self.single_action_space.high)
        observations, reward, terminated, truncated, last = self.envs.step(act)
        obs = self._encode_each(observations)
        self._episode_return += reward
        self._episode_length += 1
        obs_t = self._tensor(obs)
        final_obs_t = obs_t  # most steps end no episode: no copy, no second conversion
        ended = list(last)  # the envs whose episode ended (most steps: none)
        if ended:
            final_obs = obs.copy()
            final_obs[ended] = self._encode_each(list(last.values()))
            final_obs_t = self._tensor(final_obs)
        out_info = {
            "final_obs": final_obs_t,
            # copies (astype copies): the counters are zeroed below where an episode ended
            "episode_return": self._tensor(self._episode_return.astype(np.float32)),
            "episode_length": self._tensor(self._episode_length.copy(), np.int64),
        }
        if ended:
            self._episode_return[ended] = 0
            self._episode_length[ended] = 0
        self._obs = obs
        return (
            obs_t,
            self._tensor(reward),
            self._tensor(terminated, np.bool_),
            self._tensor(truncated, np.bool_),
            out_info,
        )

    # -- exact resume --------------------------------------------------------------------------
    # A checkpoint taken mid-episode can continue the very same episodes when the simulator's
    # state is reachable: classic control keeps it in ``unwrapped.state``, MuJoCo in qpos/qvel.
    # Other envs return None and are reset (with a fresh seed) on resume.

    def state_dict(self) -> dict[str, Any] | None:
        sims = []
        for env in self.envs.envs:
            sim = _sim_state(env.unwrapped)
            if sim is None or self._obs is None:
                return None
            sims.append(
                {
                    "sim": sim,
                    "elapsed": int(getattr(env, "_elapsed_steps", 0) or 0),
                    # PCG64 states are 128-bit integers: keep them as JSON text.
                    "rng": json.dumps(env.unwrapped.np_random.bit_generator.state),
                }
            )
        return {
            "envs": sims,
            "obs": torch.as_tensor(self._obs),
            "episode_return": torch.as_tensor(self._episode_return),
            "episode_length": torch.as_tensor(self._episode_length),
        }

    def load_state_dict(self, state: dict[str, Any]) -> torch.Tensor:
        """Restore :meth:`state_dict` (after ``reset``); returns the current observation."""
        for env, saved in zip(self.envs.envs, state["envs"], strict=True):
            _set_sim_state(env.unwrapped, saved["sim"])
            if hasattr(env, "_elapsed_steps"):
                env._elapsed_steps = saved["elapsed"]
            env.unwrapped.np_random.bit_generator.state = json.loads(saved["rng"])
        self._obs = state["obs"].numpy()
        self._episode_return[:] = state["episode_return"].numpy()
        self._episode_length[:] = state["episode_length"].numpy()
        return self._tensor(self._obs)

    # -- pictures ------------------------------------------------------------------------------

    @property
    def render_fps(self) -> float | None:
        """The task's own frame rate (its ``metadata["render_fps"]``), for real-time videos."""
        fps = self.envs.envs[0].metadata.get("render_fps")
        return float(fps) if fps else None

    def render_rgb(self, i: int = 0) -> np.ndarray:
        """(H, W, 3) uint8 frame of env ``i``: made inside ``ddprl.envs.rendering("rgb_array")``."""
        if self.render_mode != "rgb_array":
            if self._frames == "rgb_array" and self.render_mode is None:  # asked for, not offered
                raise UsageError(
                    f"video: {self.task} cannot draw frames (its render modes: "
                    f"{', '.join(self.render_modes) or 'none'}); ddprl eval gives its returns"
                )
            raise UsageError(
                f"video: this {self.task} env was made with render_mode={self.render_mode}; "
                "make it inside ddprl.envs.rendering('rgb_array')"
            )
        env = self.envs.envs[i]
        if not pygame_available():  # the base install: classic control drawn with Pillow instead
            frame = classic_picture(env)
            if frame is not None:
                return frame
        hook, why = sys.unraisablehook, None
        try:
            frame = env.render()
        except Exception as e:  # pygame missing, or MuJoCo with no OpenGL backend (MUJOCO_GL)
            why = reason(e)  # text only: the exception would keep the half-made viewer alive
            # The viewer the failed call half made is freed as this block ends, and its __del__
            # fails in turn ("Exception ignored in ..."): the error below is the one to show.
            sys.unraisablehook = lambda _: None
        if why is not None:
            gc.collect()
            sys.unraisablehook = hook
            if hasattr(env.unwrapped, "mujoco_renderer"):
                raise cannot_render(self.task, why)
            if not pygame_available():  # Gymnasium's message names its own extra, not ddprl's
                raise UsageError(f"video: {self.task} is drawn with pygame, not installed: pip install 'ddprl[video]'")
            raise UsageError(f"cannot render {self.task} ({why})")
        return np.ascontiguousarray(np.asarray(frame, dtype=np.uint8)[..., :3])

    def _render_text(self, i: int = 0) -> str:
        return str(self.envs.envs[i].render())

    def close(self) -> None:
        self.envs.close()


class EnvList:
    """``num_envs`` Gymnasium envs stepped one after another, each reset in the step its episode
    ends: what Gymnasium's ``SyncVectorEnv`` does in ``SAME_STEP`` mode, the same calls in the same
    order (a test compares their trajectories), without its generic work a step (the action space
    iterated, observations deep-copied, infos merged), which cost ~3x a CartPole step itself.

    >>> envs = EnvList(lambda: gym.make("CartPole-v1"), 2)
    >>> len(envs.reset(seed=0)), envs.step(np.zeros(2, np.int64))[1]
    (2, array([1., 1.]))
    """

    def __init__(self, make: Callable[[], gym.Env], num_envs: int):
        self.envs = [make() for _ in range(num_envs)]
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space

    def reset(self, seed: int | None = None) -> list[Any]:
        """Every env's first observation; env ``i`` seeded ``seed + i`` (as SyncVectorEnv seeds)."""
        return [env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(self.envs)]

    def step(self, actions: Sequence[Any]) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, dict[int, Any]]:
        """One step of each env with its row of ``actions``. Returns the observations (of the next
        episode where one ended), float64 rewards, terminated and truncated flags, and the ended
        episodes' last observations by env index (empty on most steps)."""
        n = len(self.envs)
        observations: list[Any] = [None] * n
        reward, terminated, truncated = np.empty(n), np.empty(n, np.bool_), np.empty(n, np.bool_)
        last: dict[int, Any] = {}
        for i, env in enumerate(self.envs):
            obs, reward[i], terminated[i], truncated[i], _ = env.step(actions[i])
            if terminated[i] or truncated[i]:
                last[i] = obs
                obs, _ = env.reset()
            observations[i] = obs
        return observations, reward, terminated, truncated, last

    def close(self) -> None:
        for env in self.envs:
            env.close()


def env_creator(task: str) -> Any:
    """What ``gym.make(task)`` calls: the registered entry point, imported when it is a string."""
    from gymnasium.envs.registration import load_env_creator

    creator = gym.spec(task).entry_point
    return load_env_creator(creator) if isinstance(creator, str) else creator


def _render_modes(task: str, env_kwargs: dict[str, Any]) -> list[str]:
    """What ``render_mode`` values ``task`` accepts, from its class's metadata when the entry
    point is a class, else from an env made to ask."""
    creator = env_creator(task)
    modes = getattr(creator, "metadata", {}).get("render_modes")
    if modes is None:  # a factory function: only the env it makes knows
        probe = gym.make(task, **env_kwargs)
        modes = probe.metadata.get("render_modes", [])
        probe.close()
    return list(modes)


def _sim_state(env: Any) -> dict[str, torch.Tensor] | None:
    if hasattr(env, "data") and hasattr(env, "set_state"):  # Gymnasium MuJoCo
        return {"qpos": torch.as_tensor(env.data.qpos.copy()), "qvel": torch.as_tensor(env.data.qvel.copy())}
    state = getattr(env, "state", None)
    if isinstance(state, (np.ndarray, tuple, list)):
        return {"state": torch.as_tensor(np.asarray(state, dtype=np.float64))}
    return None


def _set_sim_state(env: Any, sim: dict[str, torch.Tensor]) -> None:
    if "qpos" in sim:
        env.set_state(sim["qpos"].numpy(), sim["qvel"].numpy())
    else:
        original = env.state
        value = sim["state"].numpy()
        env.state = tuple(value.tolist()) if isinstance(original, tuple) else value.astype(np.asarray(original).dtype)
