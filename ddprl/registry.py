"""The algorithms ddprl knows: one declaration each, read by the CLI, config loading, eval and play.

Adding an algorithm is its own folder plus one line in :data:`BUILTIN` (or, from another
package, a call to :func:`register` / an entry point in the ``ddprl.algorithms`` group)::

    ALGORITHM = Algorithm(
        name="ppo", config=PPOConfig,                        # its keys: a JobConfig/RLConfig subclass
        train="ddprl.algos.ppo.loop:train",                  # train(rt, cfg), run on every rank
        load_actor="ddprl.algos.ppo.loop:load_actor",        # (cfg, state, device) -> Actor, for eval/play
        defaults=Path(__file__).with_name("defaults.yaml"),  # its values (a YAML file or a dict)
        architecture_keys=("policy", "hidden_sizes"),        # a resumed run may not change these
    )

Functions are named as ``"module:function"`` (imported only when needed, so ``ddprl keys``
stays fast) or given as callables.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from ddprl.errors import UsageError

# Built-in algorithms: the modules whose ALGORITHM is registered on first use.
BUILTIN = (
    "ddprl.algos.ppo",
    "ddprl.algos.tdmpc2",
    "ddprl.algos.qmix",
    "ddprl.supervised",
    "ddprl.algos.ppo_jax",
)
# How each engine starts a job's processes (torch: DDP ranks; jax: one process per machine).
LAUNCHERS = {"torch": "ddprl.runtime:launch", "jax": "ddprl.jax.runtime:launch"}
DEFAULT_ENGINE = "torch"
ENTRY_POINT_GROUP = "ddprl.algorithms"
DEFAULT_ALGO = "ppo"

FunctionRef = str | Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """How ddprl trains, resumes and evaluates one algorithm."""

    name: str
    config: type  # a dataclass deriving from ddprl.config.schema.JobConfig (RLConfig for RL)
    train: FunctionRef  # train(rt, cfg) on every rank
    load_actor: FunctionRef | None = None  # (cfg, state, device) -> ddprl.evaluate.Actor; None: no eval/play
    defaults: Path | Mapping[str, Any] | None = None  # values of its keys (YAML file or dict)
    architecture_keys: tuple[str, ...] = ()  # keys a resumed run may not change
    # prepare(cfg, overrides, config_name, resuming) -> cfg: last changes before launch (PPO: autoscale)
    prepare: FunctionRef | None = None
    # eval_checkpoint(checkpoint_dict, args) -> exit code: `ddprl eval` for algorithms without a
    # policy to roll out (supervised: test-set metrics); None: eval/play go through load_actor
    eval_checkpoint: FunctionRef | None = None
    engine: str = "torch"
    description: str = ""

    def has_key(self, name: str) -> bool:
        """Whether ``name`` is one of this algorithm's config keys."""
        from ddprl.config.schema import public_fields

        return any(f.name == name for f in public_fields(self.config))

    def train_fn(self) -> Callable[..., Any]:
        return _resolve(self.train)

    def actor_loader(self) -> Callable[..., Any]:
        if self.load_actor is None:
            raise UsageError(f"algo={self.name} has no policy to evaluate or play")
        return _resolve(self.load_actor)

    def checkpoint_evaluator(self) -> Callable[..., Any] | None:
        return None if self.eval_checkpoint is None else _resolve(self.eval_checkpoint)

    def prepare_fn(self) -> Callable[..., Any] | None:
        return None if self.prepare is None else _resolve(self.prepare)

    def launch_fn(self) -> Callable[..., Any]:
        """``launch(fn, cfg)`` of this algorithm's engine: runs ``fn(rt, cfg)`` in every process."""
        return _resolve(LAUNCHERS[self.engine])

    def default_values(self) -> dict[str, Any]:
        if self.defaults is None:
            return {}
        if isinstance(self.defaults, Mapping):
            return dict(self.defaults)
        import yaml

        with open(self.defaults) as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise UsageError(f"{self.defaults}: expected a mapping of key: value")
        return data


def _resolve(ref: FunctionRef) -> Callable[..., Any]:
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


_REGISTRY: dict[tuple[str, str], Algorithm] = {}  # (name, engine) -> declaration
_loaded = False


def register(algorithm: Algorithm) -> Algorithm:
    """Make ``algorithm`` known to ``ddprl train/eval/play/keys`` (a later declaration replaces one
    of the same name and engine)."""
    if algorithm.engine not in LAUNCHERS:
        raise ValueError(f"engine={algorithm.engine!r} of algo={algorithm.name}: engines are {', '.join(LAUNCHERS)}")
    _REGISTRY[(algorithm.name, algorithm.engine)] = algorithm
    return algorithm


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN:
        algo = importlib.import_module(module).ALGORITHM
        _REGISTRY.setdefault((algo.name, algo.engine), algo)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        algo = entry.load()
        _REGISTRY.setdefault((algo.name, algo.engine), algo)


def names() -> list[str]:
    _load_builtin()
    return sorted({name for name, _ in _REGISTRY})


def declarations() -> list[Algorithm]:
    """Every declaration, by name then engine."""
    _load_builtin()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get(name: str, engine: str = DEFAULT_ENGINE) -> Algorithm:
    """The declaration of ``name`` on ``engine``; a UsageError naming near matches when there is none."""
    _load_builtin()
    if (name, engine) in _REGISTRY:
        return _REGISTRY[(name, engine)]
    if engine not in LAUNCHERS:
        near = difflib.get_close_matches(engine, list(LAUNCHERS), n=2, cutoff=0.6)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UsageError(f"unknown engine {engine!r}{hint}; choose from {', '.join(LAUNCHERS)}")
    if name in names():
        engines = sorted(e for n, e in _REGISTRY if n == name)
        raise UsageError(f"algo={name} has no engine={engine}; it runs on engine={' | '.join(engines)}")
    near = difflib.get_close_matches(name, names(), n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise UsageError(f"unknown algo {name!r}{hint}; choose from {', '.join(names())}")
