"""SMAX battles (JaxMARL's SMAC-like unit micromanagement in JAX) behind ``MultiAgentVecEnv``.

``smax/<scenario>`` (``smax/3m``, ``smax/2s3z``, ``smax/5m_vs_6m``, ``smax/smacv2_5_units``, ...):
the learners control the allies, JaxMARL's heuristic controls the enemies
(``HeuristicEnemySMAX``), with the settings JaxMARL's own QMIX trains on: enemies attack the
closest ally, agents see the enemies' previous actions, and a unit touching a wall dies.

All ``num_envs`` battles of a rank step in one compiled call (``jax.vmap``) on the rank's
device; the arrays cross to torch without a Python loop over environments. What this adapter
adds to JaxMARL's ``step``:

- the true last step of an episode (``info["final_obs"]``): JaxMARL's step resets a finished
  battle and returns only the first observation of the next;
- terminated (every unit of one side dead) apart from truncated (the time limit reached with
  both sides standing: a draw to bootstrap from). SMAX's ``max_steps`` (100 in every scenario)
  ends a battle after max_steps + 1 steps, as JaxMARL's QMIX sees it; ``time_limit=T`` gives
  battles of at most T steps;
- the team reward once: SMAX gives every ally the same team reward (damage dealt, normalised,
  plus 1 for a win), so it is not summed over agents as the per-agent rewards of LBF are;
- ``info["episode_won"]``: 1 where the episode ended with every enemy dead and an ally alive
  (SMAC's win; a battle where both sides die together is a draw);
- with ``full_obs=True``, ``MAObs.full``: each agent's observation with unlimited sight range
  (every living unit's block filled in; a dead unit's, and a dead agent's whole observation,
  still zero), computed from the same state in the same compiled call;
- ``node_layout`` (:class:`~ddprl.envs.marl.graph.NodeLayout`, with SMAX's default
  ``observation_type="unit_list"``): an agent's observation is one 13-feature block per other
  unit (allies, then enemies, by index) and its own 10 features last; a block is zero where the
  unit is out of sight range or dead, or the agent is dead. The node view puts SELF first.

Env ``i`` draws from ``PRNGKey(seed + i)``: the same seed, the same battles.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types
from typing import Any

import numpy as np
import torch

from ddprl.envs.marl.base import MAObs
from ddprl.envs.marl.graph import NodeLayout, NodeType
from ddprl.errors import UsageError

# JaxMARL's QMIX settings for SMAX (its baselines' env_kwargs)
JAXMARL_SETTINGS = {"see_enemy_actions": True, "walls_cause_death": True, "attack_mode": "closest"}


def _import_smax() -> Any:
    """``jaxmarl.environments.smax``, without running ``jaxmarl``'s and ``jaxmarl.environments``'
    ``__init__``: they import every JaxMARL environment (7 s here, against 1 s for SMAX alone)
    and print about optional submodules. The two packages are stood in for during the import
    and removed after it, so a later ``import jaxmarl`` still runs them, finding SMAX loaded."""
    # A torch rank shares its GPU with JAX: no preallocation of 75 % of its memory.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if "jaxmarl" in sys.modules:  # imported the usual way already: its __init__ has run
        return importlib.import_module("jaxmarl.environments.smax")
    spec = importlib.util.find_spec("jaxmarl")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("SMAX tasks need the jaxmarl package: pip install jaxmarl (Python 3.11+)")
    root = list(spec.submodule_search_locations)[0]
    packages = {"jaxmarl": root, "jaxmarl.environments": os.path.join(root, "environments")}
    for name, path in packages.items():
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    try:
        return importlib.import_module("jaxmarl.environments.smax")
    finally:
        for name in packages:
            del sys.modules[name]  # SMAX's own modules stay loaded


def smax_task_names() -> list[str]:
    return [f"smax/{name}" for name in sorted(_import_smax().smax_env.MAP_NAME_TO_SCENARIO)]


def _jax_device(device: torch.device) -> Any:
    """The JAX device of a torch device: the same GPU where JAX has one, else the CPU."""
    import jax

    if device.type == "cuda":
        try:
            return jax.devices("gpu")[device.index or 0]
        except RuntimeError:  # a CPU-only jax: battles on the CPU, tensors moved to the GPU
            pass
    return jax.devices("cpu")[0]


def _to_torch(array: Any, device: torch.device) -> torch.Tensor:
    return torch.from_dlpack(array).to(device)


class _Battles:
    """One scenario's env and its batched, compiled reset and step (built once per process and
    settings: every env of a rank, and its evaluation envs, share the compiled functions)."""

    def __init__(self, scenario: str, settings: tuple[tuple[str, Any], ...], full_obs: bool = False):
        import jax
        import jax.numpy as jnp

        smax = _import_smax()
        # SMAX indexes its per-unit-type tables with traced values: a list given on the command
        # line (unit_type_sight_ranges=[...]) must be an array
        kwargs = {k: jnp.asarray(v, dtype=jnp.float32) if isinstance(v, (list, tuple)) else v for k, v in settings}
        try:
            env = smax.HeuristicEnemySMAX(scenario=smax.map_name_to_scenario(scenario), **kwargs)
        except TypeError as e:  # an unknown keyword
            raise UsageError(f"smax/{scenario}: {e}") from None
        self.env, agents, n_allies = env, env.agents, env.num_allies
        full = _full_obs(env) if full_obs else None

        def observe(obs: dict[str, Any], state: Any) -> tuple[Any, ...]:
            avail = env.get_avail_actions(state)
            arrays = (
                jnp.stack([obs[a] for a in agents]).astype(jnp.float32),
                obs["world_state"].astype(jnp.float32),
                jnp.stack([avail[a] for a in agents]).astype(jnp.bool_),
            )
            return arrays if full is None else (*arrays, full(state.state))

        def reset_one(key: Any) -> tuple[Any, Any, tuple[Any, ...]]:
            key, reset_key = jax.random.split(key)
            obs, state = env.reset(reset_key)
            # the types a step returns (a reset's state has a weakly typed leaf): one compiled step
            state = jax.tree.map(lambda x: jnp.asarray(x, dtype=x.dtype), state)
            return key, state, observe(obs, state)

        def step_one(key: Any, state: Any, actions: Any) -> tuple[Any, ...]:
            key, step_key, reset_key = jax.random.split(key, 3)
            obs, state, rewards, dones, _ = env.step_env(step_key, state, {a: actions[i] for i, a in enumerate(agents)})
            alive = state.state.unit_alive
            allies_dead, enemies_dead = ~alive[:n_allies].any(), ~alive[n_allies:].any()
            done = dones["__all__"]
            terminated = allies_dead | enemies_dead
            final = observe(obs, state)
            first_obs, first_state = env.reset(reset_key)
            state = jax.tree.map(lambda new, old: jnp.where(done, new, old), first_state, state)
            nxt = jax.tree.map(lambda new, old: jnp.where(done, new, old), observe(first_obs, first_state), final)
            info = (rewards[agents[0]], terminated, done & ~terminated, enemies_dead & ~allies_dead)
            return key, state, nxt, final, info

        self.reset = jax.jit(jax.vmap(reset_one))
        self.step = jax.jit(jax.vmap(step_one), donate_argnums=(0, 1))


def _full_obs(env: Any) -> Any:
    """The allies' observations (A, O) of a SMAX state as JaxMARL's ``get_obs_unit_list`` builds
    them, without its sight-range test: a block is zero only where its unit or the observer is
    dead. Positions stay divided by the observer's sight range, so a block the agent sees is
    bitwise the same in both, and an unseen one has a relative position beyond 1."""
    import jax
    import jax.numpy as jnp

    smax = env._env  # JaxMARL's SMAX under the heuristic-enemy wrapper
    n_units = smax.num_allies + smax.num_enemies
    # ally i's blocks: every other unit by index, allies first (as get_obs_unit_list orders them)
    others = jnp.array([[j for j in range(n_units) if j != i] for i in range(smax.num_allies)], dtype=jnp.int32)

    def observe(state: Any, i: Any, seen: Any) -> Any:
        blocks = jax.vmap(smax._observe_features, in_axes=(None, None, 0))(state, i, seen)
        alive = state.unit_alive[i] & state.unit_alive[seen]
        blocks = jnp.where(alive[:, None], blocks, jnp.zeros_like(blocks))
        return jnp.concatenate([blocks.reshape(-1), smax._get_own_features(state, i)])

    def full(state: Any) -> Any:
        return jax.vmap(observe, in_axes=(None, 0, 0))(state, jnp.arange(smax.num_allies), others).astype(jnp.float32)

    return full


def _node_layout(env: Any) -> NodeLayout:
    """SMAX's unit-list observation as nodes: SELF (its own block, last in the vector), then the
    other allies and the enemies in the vector's order."""
    unit, own = len(env.unit_features), len(env.own_features)
    n_allies, n_enemies = env.num_allies - 1, env.num_enemies
    others = n_allies + n_enemies
    types = (NodeType.SELF, *[NodeType.ALLY] * n_allies, *[NodeType.ENEMY] * n_enemies)
    slices = ((others * unit, others * unit + own), *((k * unit, (k + 1) * unit) for k in range(others)))
    return NodeLayout(obs_dim=others * unit + own, types=types, slices=slices)


@functools.cache
def _battles(scenario: str, settings: tuple[tuple[str, Any], ...], full_obs: bool) -> _Battles:
    return _Battles(scenario, settings, full_obs)


class SmaxVecEnv:
    """``num_envs`` battles of one SMAX scenario. kwargs: ``time_limit`` (steps in a battle at
    most) or SMAX's ``max_steps``, ``full_obs`` (also return ``MAObs.full``), and SMAX's own
    (``won_battle_bonus``, ``observation_type``, ...) over JaxMARL's settings.

    >>> env = SmaxVecEnv("3m", num_envs=8, seed=0, full_obs=True)  # doctest: +SKIP
    >>> obs = env.reset()
    >>> obs.obs.shape, obs.full.shape, env.node_layout.to_nodes(obs.obs).shape
    (torch.Size([8, 3, 75]), torch.Size([8, 3, 75]), torch.Size([8, 3, 6, 13]))
    """

    node_layout: NodeLayout  # absent with observation_type="conic", whose blocks are no fixed units

    extra_info_keys: tuple[str, ...] = ("episode_won",)

    def __init__(self, scenario: str, num_envs: int, seed: int = 0, device: str | torch.device = "cpu", **kwargs: Any):
        import jax

        if scenario not in _import_smax().smax_env.MAP_NAME_TO_SCENARIO:
            raise UsageError(f"unknown SMAX scenario {scenario!r}")
        if "time_limit" in kwargs and "max_steps" in kwargs:
            raise UsageError(f"smax/{scenario}: give time_limit or max_steps, not both")
        if "time_limit" in kwargs:  # SMAX ends a battle one step after its step count reaches max_steps
            limit = kwargs.pop("time_limit")
            if not (isinstance(limit, int) and limit > 0):
                raise UsageError(f"smax/{scenario}: time_limit must be a positive int, got {limit!r}")
            kwargs["max_steps"] = limit - 1
        full_obs = kwargs.pop("full_obs", False)
        if not isinstance(full_obs, bool):
            raise UsageError(f"smax/{scenario}: full_obs must be true or false, got {full_obs!r}")
        settings = {**JAXMARL_SETTINGS, **{k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}}
        if settings.get("action_type", "discrete") != "discrete":
            raise UsageError(f"smax/{scenario}: QMIX needs action_type=discrete")
        unit_list = settings.get("observation_type", "unit_list") == "unit_list"
        if full_obs and not unit_list:
            raise UsageError(f"smax/{scenario}: full_obs needs observation_type=unit_list")
        try:
            self._battles = _battles(scenario, tuple(sorted(settings.items())), full_obs)
        except TypeError:  # an unhashable setting (a list): compiled for this env alone
            self._battles = _Battles(scenario, tuple(sorted(settings.items())), full_obs)
        env = self._battles.env
        if unit_list:
            self.node_layout = _node_layout(env)
        if not (isinstance(env.max_steps, int) and env.max_steps >= 0):
            raise UsageError(f"smax/{scenario}: max_steps must be an int >= 0, got {env.max_steps!r}")
        self.device, self.num_envs = torch.device(device), num_envs
        self.episode_limit = env.max_steps + 1
        self.n_agents = env.num_agents
        self.n_actions = int(env.action_space(env.agents[0]).n)
        self.obs_dim = int(env.observation_space(env.agents[0]).shape[0])
        self._jax_device = _jax_device(self.device)
        self._keys = self._seed_keys(seed)
        self._state: Any = None
        self.state_dim = int(jax.eval_shape(self._battles.reset, self._keys)[2][1].shape[1])
        self._episode_return = torch.zeros(num_envs, device=self.device)
        self._episode_length = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def _seed_keys(self, seed: int) -> Any:
        import jax
        import jax.numpy as jnp

        seeds = jnp.arange(self.num_envs, dtype=jnp.uint32) + np.uint32(seed % 2**32)
        return jax.device_put(jax.vmap(jax.random.PRNGKey)(seeds), self._jax_device)

    def _maobs(self, arrays: tuple[Any, ...], first: torch.Tensor) -> MAObs:
        obs, state, avail, *full = (_to_torch(a, self.device) for a in arrays)
        return MAObs(obs, state, avail, first, full[0] if full else None)

    def reset(self, seed: int | None = None) -> MAObs:
        """Reset every battle; env ``i`` then draws from ``PRNGKey(seed + i)`` (no seed: the
        streams continue)."""
        if seed is not None:
            self._keys = self._seed_keys(seed)
        self._keys, self._state, arrays = self._battles.reset(self._keys)
        self._episode_return.zero_()
        self._episode_length.zero_()
        return self._maobs(arrays, torch.ones(self.num_envs, dtype=torch.bool, device=self.device))

    def step(self, actions: torch.Tensor) -> tuple[MAObs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        import jax

        acts = jax.device_put(actions.detach().to("cpu", torch.int32).numpy(), self._jax_device)
        self._keys, self._state, nxt, final, info = self._battles.step(self._keys, self._state, acts)
        reward, terminated, truncated, won = (_to_torch(x, self.device) for x in info)
        reward = reward.float()
        done = terminated | truncated
        self._episode_return += reward
        self._episode_length += 1
        out: dict[str, Any] = {
            "episode_return": self._episode_return.clone(),
            "episode_length": self._episode_length.clone(),
            "episode_won": won.float(),
            "final_obs": self._maobs(final, torch.zeros_like(done)),
        }
        self._episode_return.masked_fill_(done, 0)
        self._episode_length.masked_fill_(done, 0)
        return self._maobs(nxt, done), reward, terminated, truncated, out

    def render_rgb(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of env 0: the map from above, allies blue and enemies red, each
        unit a disc of its radius filled in proportion to its health; the dead are not drawn."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Circle, Rectangle

        env, state = self._battles.env, self._state.state
        positions = np.asarray(state.unit_positions[0])
        alive, teams = np.asarray(state.unit_alive[0]), np.asarray(state.unit_teams[0])
        types = np.asarray(state.unit_types[0])
        health = np.asarray(state.unit_health[0]) / np.asarray(env.unit_type_health)[types]
        radius = np.asarray(env.unit_type_radiuses)[types]
        fig = Figure(figsize=(4, 4), dpi=80)
        canvas = FigureCanvasAgg(fig)  # drawn off screen, whatever backend pyplot uses
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, env.map_width)
        ax.set_ylim(0, env.map_height)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.add_patch(Rectangle((0, 0), env.map_width, env.map_height, fill=False, color="0.6"))
        for i in np.flatnonzero(alive):
            color = "tab:blue" if teams[i] == 0 else "tab:red"
            ax.add_patch(Circle(positions[i], radius[i] * 1.5, fill=False, color=color))
            ax.add_patch(Circle(positions[i], radius[i] * 1.5 * float(np.sqrt(health[i])), color=color))
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()

    def close(self) -> None:
        self._state = None
