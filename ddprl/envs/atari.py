"""Atari 2600 games (the Arcade Learning Environment) behind ddprl's ``VecEnv`` contract.

``task=Breakout-v5`` (EnvPool's names; ``ALE/Breakout-v5``, Gymnasium's, names the same game)
runs with the preprocessing of Mnih et al. (2015) as the PPO paper and CleanRL's
``ppo_atari_envpool.py`` use it: up to 30 no-op starts, FIRE at the start where the game has it,
4 frames per agent step (the last two max-pooled), 84x84 grey, 4 frames stacked: uint8
observations of shape (4, 84, 84). No sticky actions (``repeat_action_probability=0``, as
EnvPool's default that CleanRL keeps; Machado et al. 2018 and ALE's v5 use 0.25), and at most
27,000 agent steps (108,000 frames, 30 minutes of play) per game.

Two back-ends build these observations: EnvPool (C++ threads, batched) and Gymnasium with
ale-py (``AtariPreprocessing`` and ``FrameStackObservation``, one env after another).
``backend="auto"`` takes EnvPool where it is installed. Both give the same shapes, dtypes and
episode rules; not the same frames for one seed (FIRE and no-op timing, random streams).

``training=True`` makes the env the learner sees: a lost life ends the learner's episode
(``terminated``; the game goes on: episodic life) and rewards are clipped to their sign.
``training=False`` (evaluation, play) runs whole games with the game's own rewards. Either way
``info["episode_return"]`` and ``info["episode_length"]`` are the whole game's raw score and
agent steps, reported where ``info["episode_end"]`` marks the end of a game.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from ddprl.errors import UsageError

# The ALE's single-player games (ale-py 0.12's ROMs, the ones EnvPool ships too), by ROM id.
ROMS = (
    "adventure air_raid alien amidar assault asterix asteroids atlantis2 atlantis backgammon bank_heist "
    "basic_math battle_zone beam_rider berzerk blackjack bowling boxing breakout carnival casino centipede "
    "chopper_command crazy_climber crossbow darkchambers defender demon_attack donkey_kong double_dunk "
    "earthworld elevator_action enduro entombed et fishing_derby flag_capture freeway frogger frostbite "
    "galaxian gopher gravitar hangman haunted_house hero human_cannonball ice_hockey jamesbond "
    "journey_escape kaboom kangaroo keystone_kapers king_kong klax koolaid krull kung_fu_master laser_gates "
    "lost_luggage mario_bros miniature_golf montezuma_revenge mr_do ms_pacman name_this_game othello pacman "
    "phoenix pitfall2 pitfall pong pooyan private_eye qbert riverraid road_runner robotank seaquest "
    "sir_lancelot skiing solaris space_invaders space_war star_gunner superman surround tennis tetris "
    "tic_tac_toe_3d time_pilot trondead turmoil tutankham up_n_down venture video_checkers video_chess "
    "video_cube video_pinball wizard_of_wor word_zapper yars_revenge zaxxon"
).split()

BACKENDS = ("auto", "envpool", "gymnasium")
# The modules each back-end imports, and the package that installs each.
_NEEDS = {"envpool": ("envpool",), "gymnasium": ("ale_py", "cv2")}
_PACKAGE = {"envpool": "envpool", "ale_py": "ale-py", "cv2": "opencv-python-headless"}
INSTALL = 'pip install -e ".[atari]"'

STACK, SIZE, FRAME_SKIP = 4, 84, 4  # frames stacked, pixels a side, frames per agent step
FPS = 60  # the Atari 2600's frame rate: videos play agent steps at FPS / FRAME_SKIP


def game_name(rom: str) -> str:
    """The task's game name as EnvPool spells it: ``space_invaders`` -> ``SpaceInvaders``."""
    return "".join(part.capitalize() for part in rom.split("_"))


_BY_KEY = {rom.replace("_", ""): rom for rom in ROMS}


def atari_rom(task: Any) -> str | None:
    """The ROM id of an Atari task (``Breakout-v5`` or ``ALE/Breakout-v5`` -> ``breakout``), else None.

    >>> atari_rom("ALE/SpaceInvaders-v5"), atari_rom("CartPole-v1")
    ('space_invaders', None)
    """
    name = str(task).removeprefix("ALE/")
    if not name.endswith("-v5"):
        return None
    return _BY_KEY.get(name.removesuffix("-v5").lower())


def task_names() -> list[str]:
    """Every Atari task name, as ``ddprl`` spells them (for near-match suggestions)."""
    return [f"{game_name(rom)}-v5" for rom in ROMS]


def import_envpool() -> Any:
    """``import envpool`` without JAX: EnvPool imports JAX, when installed, only for its XLA
    interface (unused here), which takes seconds in every process that makes an Atari env.
    A process that has imported JAX already keeps it."""
    if "jax" in sys.modules:
        import envpool

        return envpool
    sys.modules["jax"] = None  # type: ignore[assignment]  # `import jax` raises ImportError: EnvPool skips XLA
    try:
        import envpool
    finally:
        del sys.modules["jax"]
    return envpool


def missing_packages(backend: str, installed: Callable[[str], bool] | None = None) -> list[str]:
    """The packages ``backend`` needs that are not installed (``auto``: none when either
    back-end is complete, else what each lacks). ``installed(module) -> bool`` defaults to a
    ``find_spec`` look-up: nothing is imported (importing EnvPool takes seconds)."""
    has = installed or (lambda module: importlib.util.find_spec(module) is not None)
    missing = {b: [_PACKAGE[m] for m in modules if not has(m)] for b, modules in _NEEDS.items()}
    if backend == "auto":
        return [] if not all(missing.values()) else [p for packages in missing.values() for p in packages]
    return missing[backend]


def install_message(task: str, backend: str, missing: list[str]) -> str:
    """One line: what ``task`` on ``backend`` lacks and the command that installs it."""
    needs = {"auto": "EnvPool, or ale-py with opencv", "envpool": "EnvPool", "gymnasium": "ale-py with opencv"}
    return (
        f"task={task} is an Atari game: env_backend={backend} needs {needs[backend]} "
        f"(missing: {', '.join(missing)}); {INSTALL}"
    )


def check_installed(task: str, backend: str = "auto") -> None:
    """A UsageError of one line when the packages ``backend`` needs for ``task`` are missing."""
    if backend not in BACKENDS:
        raise UsageError(f"env_backend={backend!r} is not {', '.join(BACKENDS)}")
    missing = missing_packages(backend)
    if missing:
        raise UsageError(install_message(task, backend, missing))


def chosen_backend(backend: str) -> str:
    """``auto`` made concrete: EnvPool where its packages are installed, else Gymnasium."""
    if backend != "auto":
        return backend
    return "envpool" if not missing_packages("envpool") else "gymnasium"


def overlap_unsupported(task: str, backend: str, num_envs: int) -> str | None:
    """Why ``task`` cannot step a rank's ``num_envs`` games in two parts that overlap with acting
    (``AtariVecEnv(parts=2)``), or None when it can."""
    if atari_rom(task) is None:
        return f"{task} is no Atari game (EnvPool's Atari games step in parts)"
    if chosen_backend(backend) != "envpool":
        return "the games run on Gymnasium, one after another in the rank's process: nothing to overlap"
    if num_envs < 2 or num_envs % 2:
        return f"a rank's {num_envs} games do not split into two equal parts"
    return None


class Settings(NamedTuple):
    """The game settings a task's ``env_kwargs`` may change (defaults: CleanRL's EnvPool run)."""

    repeat_action_probability: float = 0.0  # sticky actions: 0.25 is Machado et al. 2018
    noop_max: int = 30  # up to this many no-op frames start a game (Mnih et al. 2015)
    max_episode_steps: int = 27_000  # agent steps per game (108,000 frames)
    full_action_space: bool = False  # all 18 actions instead of the game's minimal set


class Step(NamedTuple):
    """One step of a back-end, numpy arrays over its envs; games that ended were reset in it."""

    obs: np.ndarray  # (N, 4, 84, 84) uint8: the next episode's first observation where one ended
    final_obs: np.ndarray  # (N, 4, 84, 84) uint8: the episode's last observation where one ended
    reward: np.ndarray  # (N,) float32, the game's own
    terminated: np.ndarray  # (N,) bool: the learner's episode ended (a lost life in training)
    truncated: np.ndarray  # (N,) bool: the time limit
    game_over: np.ndarray  # (N,) bool: the whole game ended (the scored episode)


class Games:
    """What a back-end offers: :meth:`send` starts a step of its games, :meth:`recv` returns it."""

    def send(self, actions: np.ndarray) -> None:
        raise NotImplementedError

    def recv(self) -> Step:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> Step:
        self.send(actions)
        return self.recv()


# -- EnvPool -------------------------------------------------------------------------------------------


class EnvPoolAtari(Games):
    """``num_envs`` games in one EnvPool (C++ threads); env ``i`` seeded ``seed + i``.

    EnvPool resets an env in the call after its episode ended (the action of that call is
    ignored). :meth:`step` resets those envs at once with a call of their own, so that the
    observation it returns is the next episode's first, as Gymnasium's same-step autoreset.
    That call is a step (never ``reset``, which would restart the game): after a lost life
    (``episodic_life``) the game continues, after a game over it starts anew.
    """

    def __init__(
        self,
        rom: str,
        num_envs: int,
        seed: int,
        settings: Settings,
        episodic_life: bool,
        threads_on: list[int] | None = None,
    ):
        from ddprl.runtime.placement import usable_cores

        self.num_envs = num_envs
        # A thread per env up to the cores this rank may use (a rank's share under cpu_bind), or
        # pinned to ``threads_on`` (contiguous: EnvPool pins its thread i to core offset + i).
        pinned = {"thread_affinity_offset": threads_on[0]} if threads_on else {}
        self._kwargs = {
            "num_envs": num_envs,
            "num_threads": min(num_envs, len(threads_on) if threads_on else usable_cores()),
            **pinned,
            "episodic_life": episodic_life,
            "reward_clip": False,  # the loss's clipping is done above, the raw score is kept
            "repeat_action_probability": settings.repeat_action_probability,
            "noop_max": settings.noop_max,
            "max_episode_steps": settings.max_episode_steps,
            "full_action_space": settings.full_action_space,
            "frame_skip": FRAME_SKIP,
            "stack_num": STACK,
            "img_height": SIZE,
            "img_width": SIZE,
            "use_fire_reset": True,
            "render_mode": "rgb_array",  # frames drawn only when asked for (render_rgb): no cost a step
        }
        self._task_id = f"{game_name(rom)}-v5"
        self._pool = self._make(seed)
        self.seed, self.fresh = seed, True  # fresh: not stepped since made with these seeds
        self.action_space = gym.spaces.Discrete(int(self._pool.action_space.n))

    def _make(self, seed: int) -> Any:
        envpool = import_envpool()
        # EnvPool seeds are int32; derived ddprl seeds lie just below 2^31.
        seeds = [(seed + i) % 2**31 for i in range(self.num_envs)]
        return envpool.make(self._task_id, env_type="gymnasium", seed=seeds, **self._kwargs)

    def reset(self, seed: int) -> np.ndarray:
        if not (self.fresh and seed == self.seed):  # EnvPool takes its seeds when it is made
            self._pool.close()
            self._pool, self.seed = self._make(seed), seed
        self.fresh = False
        obs, info = self._pool.reset()
        return _in_env_order(obs, info["env_id"])

    def send(self, actions: np.ndarray) -> None:
        """Start a step of every env (EnvPool's threads run it); :meth:`recv` waits for it."""
        self.fresh = False
        self._pool.send(actions.astype(np.int32))

    def recv(self) -> Step:
        obs, reward, terminated, truncated, info = self._pool.recv()
        order = np.argsort(info["env_id"])
        obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
        game_over = info["terminated"][order].astype(bool) | truncated
        final_obs = obs
        ended = np.flatnonzero(terminated | truncated)
        if len(ended):
            final_obs = obs.copy()
            next_obs, *_, next_info = self._pool.step(np.zeros(len(ended), np.int32), ended.astype(np.int32))
            obs[ended] = _in_env_order(next_obs, next_info["env_id"])
        return Step(obs, final_obs, reward.astype(np.float32), terminated, truncated, game_over)

    def frame(self, i: int) -> np.ndarray:
        return self._pool.render(env_ids=[i])[0]

    def close(self) -> None:
        self._pool.close()


def _in_env_order(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
    return obs[np.argsort(env_ids)]


# -- Gymnasium + ale-py ---------------------------------------------------------------------------------


class FireReset(gym.Wrapper):
    """Press FIRE as a game starts in games that wait for it (Breakout's ball), as EnvPool's
    ``use_fire_reset``: an untrained agent would otherwise spend its start doing nothing."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:  # FIRE ended the game at once: start again
            obs, info = self.env.reset(**kwargs)
        return obs, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the learner's episode, the game goes on (Mnih et al. 2015): the reset
    after it is one step of FIRE (``fire``: games that wait for it) or of no-op; after a game
    over (or the time limit) a real reset. ``game_over`` says which ended the last step."""

    def __init__(self, env: gym.Env, fire: bool):
        super().__init__(env)
        self.lives, self.game_over, self.fire = 0, True, fire

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(1 if self.fire else 0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives, self.game_over = self.env.unwrapped.ale.lives(), False
        return obs, info


def gymnasium_atari(rom: str, settings: Settings, episodic_life: bool) -> tuple[gym.Env, EpisodicLife | None]:
    """One game with Gymnasium's Atari wrappers; the :class:`EpisodicLife` in it (None without)."""
    from ale_py.env import AtariEnv

    env: gym.Env = AtariEnv(
        game=rom,
        frameskip=1,  # AtariPreprocessing skips (and max-pools) the frames
        repeat_action_probability=settings.repeat_action_probability,
        full_action_space=settings.full_action_space,
    )
    fire = env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]
    env = gym.wrappers.AtariPreprocessing(env, noop_max=settings.noop_max, frame_skip=FRAME_SKIP, screen_size=SIZE)
    if fire:
        env = FireReset(env)
    env = gym.wrappers.FrameStackObservation(env, STACK)  # a reset fills the stack with its frame, as EnvPool
    # The limit counts the whole game's agent steps: below EpisodicLife, whose resets after a life are steps.
    env = gym.wrappers.TimeLimit(env, settings.max_episode_steps)
    if not episodic_life:
        return env, None
    life = EpisodicLife(env, fire)
    return life, life


class GymnasiumAtari(Games):
    """``num_envs`` games of :func:`gymnasium_atari` stepped one after another in this process;
    env ``i`` seeded ``seed + i`` at each :meth:`reset`."""

    def __init__(self, rom: str, num_envs: int, seed: int, settings: Settings, episodic_life: bool):
        self.num_envs, self.seed = num_envs, seed
        pairs = [gymnasium_atari(rom, settings, episodic_life) for _ in range(num_envs)]
        self.envs, self.lives = [env for env, _ in pairs], [life for _, life in pairs]
        self.action_space = self.envs[0].action_space

    def reset(self, seed: int) -> np.ndarray:
        for life in self.lives:
            if life is not None:
                life.game_over = True  # a new game, even where one is in play
        return np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])

    def send(self, actions: np.ndarray) -> None:
        """Keep the actions; :meth:`recv` steps the games with them (here, one after another)."""
        self._actions = actions

    def recv(self) -> Step:
        rows = [env.step(int(a)) for env, a in zip(self.envs, self._actions, strict=True)]
        obs = np.stack([row[0] for row in rows])
        reward = np.array([row[1] for row in rows], np.float32)
        terminated, truncated = np.array([row[2] for row in rows]), np.array([row[3] for row in rows])
        ended = terminated | truncated
        game_over = np.array([ended[i] if life is None else life.game_over for i, life in enumerate(self.lives)])
        final_obs = obs
        if ended.any():
            final_obs = obs.copy()
            for i in np.flatnonzero(ended):
                obs[i] = self.envs[i].reset()[0]
        return Step(obs, final_obs, reward, terminated, truncated, game_over)

    def frame(self, i: int) -> np.ndarray:
        return self.envs[i].unwrapped.ale.getScreenRGB()

    def close(self) -> None:
        for env in self.envs:
            env.close()


# -- the VecEnv -----------------------------------------------------------------------------------------


class AtariVecEnv:
    """``num_envs`` games of an Atari ``task`` as torch tensors on ``device`` (see the module
    docstring for the protocol). ``backend``: auto | envpool | gymnasium.

    ``parts=2`` splits the games into two halves, each a back-end of its own (env ``i`` keeps
    seed ``seed + i``), that step apart: :meth:`send` starts a half's step and :meth:`recv`
    returns it, so a rollout can act on one half while EnvPool's threads step the other.
    :meth:`step` steps them all, as with one part. ``threads_on``: contiguous cores EnvPool's
    threads are pinned to (its thread i on the i-th; default: unpinned, one a game up to the
    process's cores).

    >>> env = AtariVecEnv("Pong-v5", num_envs=2, seed=0, training=True)   # doctest: +SKIP
    >>> env.reset().shape
    torch.Size([2, 4, 84, 84])
    """

    extra_info_keys = ()

    def __init__(
        self,
        task: str,
        num_envs: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        training: bool = False,
        backend: str = "auto",
        repeat_action_probability: float = 0.0,
        noop_max: int = 30,
        max_episode_steps: int = 27_000,
        full_action_space: bool = False,
        parts: int = 1,
        threads_on: list[int] | None = None,
    ):
        rom = atari_rom(task)
        if rom is None:
            raise UsageError(f"{task!r} is no Atari task (Breakout-v5, Pong-v5, ...)")
        if parts < 1 or num_envs % parts:
            raise UsageError(f"{num_envs} games cannot be split into {parts} equal parts")
        check_installed(task, backend)
        settings = Settings(repeat_action_probability, noop_max, max_episode_steps, full_action_space)
        self.task, self.num_envs, self.seed = task, num_envs, seed
        self.device, self.training = torch.device(device), training
        self.backend = chosen_backend(backend)
        kind = EnvPoolAtari if self.backend == "envpool" else GymnasiumAtari
        size = num_envs // parts
        self.parts = parts
        self.part_slices = [slice(p * size, (p + 1) * size) for p in range(parts)]
        from ddprl.runtime.placement import contiguous

        if threads_on and (kind is not EnvPoolAtari or not contiguous(threads_on)):
            raise UsageError(f"threads_on={threads_on}: EnvPool's threads, pinned to contiguous cores")
        pinned = {"threads_on": threads_on} if threads_on else {}
        self.games: list[Games] = [kind(rom, size, seed + p * size, settings, training, **pinned) for p in range(parts)]
        self.single_observation_space = gym.spaces.Box(0, 255, (STACK, SIZE, SIZE), np.uint8)
        self.single_action_space = self.games[0].action_space
        self.render_fps = FPS / FRAME_SKIP
        self._score = np.zeros(num_envs, np.float64)  # raw score of the game in play
        self._steps = np.zeros(num_envs, np.int64)  # its agent steps

    def _tensor(self, x: np.ndarray, dtype: type = np.float32) -> torch.Tensor:
        t = torch.from_numpy(np.asarray(x, dtype=dtype))
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start every game anew; env ``i`` seeded ``seed + i`` (default: the env's seed)."""
        seed = self.seed if seed is None else seed
        obs = [games.reset(seed + s.start) for games, s in zip(self.games, self.part_slices, strict=True)]
        self._score[:] = 0
        self._steps[:] = 0
        return self._tensor(np.concatenate(obs) if self.parts > 1 else obs[0])

    def send(self, actions: torch.Tensor, part: int = 0) -> None:
        """Start a step of part ``part``'s games (``actions``: one per game of the part)."""
        self.games[part].send(actions.detach().cpu().numpy())

    def recv(self, part: int = 0) -> tuple[torch.Tensor, ...]:
        """The step :meth:`send` started for part ``part``: ``step``'s tuple over its games."""
        step, rows = self.games[part].recv(), self.part_slices[part]
        score, steps = self._score[rows], self._steps[rows]  # views: updated in place
        score += step.reward
        steps += 1
        out_info = {
            "final_obs": self._tensor(step.final_obs),
            "episode_return": self._tensor(score.astype(np.float32)),
            "episode_length": self._tensor(steps.copy(), np.int64),  # a copy: zeroed below
            "episode_end": self._tensor(step.game_over, np.bool_),
        }
        score[step.game_over] = 0  # after the copies above
        steps[step.game_over] = 0
        # Training: the loss sees rewards clipped to their sign (Mnih et al. 2015), the score stays raw.
        reward = np.sign(step.reward) if self.training else step.reward
        return (
            self._tensor(step.obs),
            self._tensor(reward),
            self._tensor(step.terminated, np.bool_),
            self._tensor(step.truncated, np.bool_),
            out_info,
        )

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.parts == 1:
            self.send(actions)
            return self.recv()
        for part, rows in enumerate(self.part_slices):
            self.send(actions[rows], part)
        steps = [self.recv(part) for part in range(self.parts)]
        *tensors, infos = zip(*steps, strict=True)
        info = {key: torch.cat([i[key] for i in infos]) for key in infos[0]}
        return (*(torch.cat(t) for t in tensors), info)

    def render_rgb(self, i: int = 0) -> np.ndarray:
        """(210, 160, 3) uint8: env ``i``'s screen."""
        size = self.num_envs // self.parts
        return np.ascontiguousarray(self.games[i // size].frame(i % size))

    def state_dict(self) -> None:
        """No exact resume: an emulator's state is not saved, a resumed run starts new games."""
        return None

    def close(self) -> None:
        for games in self.games:
            games.close()
