"""Configuration: typed schemas, YAML values shipped in the package, Hydra-grammar overrides.

Resolution order (later wins)::

    schema defaults  <-  the algorithm's defaults  <-  task/<task>.yaml  <-  <config-name>.yaml  <-  CLI

The schema is the algorithm's config class (``ddprl.registry``): the job keys every run has,
the RL keys on top for RL algorithms, and the algorithm's own. ``algo=`` picks the algorithm
and ``task=`` the task file; every other ``key=value`` sets a key of the schema. A task file may
hold a section per algorithm (``ppo: {...}``) applied only to it.
Unknown keys, bad types and out-of-range values raise :class:`~ddprl.errors.UsageError` with
the key named and near matches suggested. The result is an instance of the algorithm's config
class (a dataclass) whose ``sources`` name the layer that gave each value: ``default`` (the
schema or the algorithm's defaults), ``task preset`` (the task's file), ``config file`` (``--config-name``),
``checkpoint`` (a resumed run's) or ``command line`` (keys given from Python count as such).

>>> cfg = load_config(["steps=20000", "world_size=1"])
>>> cfg.algo, cfg.steps, cfg.world_size
('ppo', 20000, 1)
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ddprl.config.schema import JobConfig, RLConfig, public_fields

__all__ = [
    "load_config",
    "save_yaml",
    "to_dict",
    "describe",
    "key_rows",
    "format_value",
    "public_fields",
    "JobConfig",
    "RLConfig",
]
from ddprl.errors import UsageError

CONFIG_DIR = Path(str(resources.files("ddprl.config")))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{path} is not valid YAML{where}: {problem}; fix the file") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of key: value")
    return data


def _parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``key=value`` strings in Hydra's grammar → {key: python value}, in order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed: dict[str, Any] = {}
    for text in overrides:
        try:
            ov = parser.parse_override(text)
        except HydraException as e:
            first = str(e).strip().splitlines()[0]
            raise UsageError(f"cannot parse override {text!r}: {first}") from None
        if ov.is_sweep_override():
            raise UsageError(f"{text!r}: sweeps (a=1,2) are not supported; run one job per value")
        if ov.is_delete():
            raise UsageError(f"{text!r}: deleting keys is not supported; every key has a default")
        # `+key=` (add) is refused below for unknown keys like a plain override: the schema is closed.
        parsed[ov.key_or_group] = ov.value()
    return parsed


def task_preset_file(task: Any) -> Path | None:
    """The preset file of a task (``ddprl/config/task/<task>.yaml``), None when it has none.

    ``gymnax/<id>`` is gymnax's port of the Gymnasium task ``<id>`` (on engine=jax the bare id
    names it too), and ``mpe/<name>`` the particle env ``<name>``: one environment, one preset,
    however it is spelt. Every Atari game (``Breakout-v5``, ``ALE/Breakout-v5``) has ``_atari.yaml``,
    every StarCraft battle (``smax/3m``, ``sc2/3m``) ``_starcraft.yaml``."""
    if task is None:
        return None
    from ddprl.envs.atari import atari_rom

    if atari_rom(task) is not None:
        return CONFIG_DIR / "task" / "_atari.yaml"
    if str(task).startswith(("smax/", "sc2/")):
        return CONFIG_DIR / "task" / "_starcraft.yaml"
    name = str(task).removeprefix("gymnax/").removeprefix("mpe/")
    path = CONFIG_DIR / "task" / f"{name}.yaml"
    return path if "/" not in name and path.exists() else None


def _task_preset(path: Path, algo: str, algorithms: Iterable[str]) -> dict[str, Any]:
    """The keys a task file gives ``algo``: its top-level keys, then its ``<algo>:`` section. A
    file may start from a shared one (``base: _mujoco``, a file of the same folder), whose
    keys its own override."""
    data = _read_yaml(path)
    values: dict[str, Any] = {}
    base = data.pop("base", None)
    if base is not None:
        base_path = path.parent / f"{base}.yaml"
        if not base_path.exists() or base_path == path:
            raise UsageError(f"{path}: base: {base} names no other file of {path.parent}")
        values = _task_preset(base_path, algo, algorithms)
    per_algo = data.pop(algo, {}) or {}
    values.update({k: v for k, v in data.items() if k not in algorithms})
    values.update(per_algo)
    return values


def preset_note(cfg: JobConfig) -> str:
    """One line naming the keys a task preset set in this config ('' when it set none)."""
    keys = [k for k, source in cfg.sources.items() if source == "task preset"]
    if not keys:
        return ""
    values = ", ".join(f"{k}={format_value(getattr(cfg, k))}" for k in keys)
    return (
        f"task={cfg.task} preset: {values} (keys you give win; `ddprl keys algo={cfg.algo} task={cfg.task}` "
        "shows every value and where it comes from)"
    )


def named_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def config_path(config_name: str) -> Path:
    """The file of ``--config-name``: a shipped preset's name, or a path to a YAML file of your own."""
    if config_name.endswith((".yaml", ".yml")) or "/" in config_name:
        for path in (Path(config_name), Path(f"{config_name}.yaml")):
            if path.is_file():
                return path
        raise UsageError(f"--config-name {config_name}: no such file")
    path = CONFIG_DIR / f"{config_name}.yaml"
    if not path.exists():
        raise UsageError(
            f"unknown --config-name {config_name!r}{_suggest(config_name, named_configs())}; "
            f"choose from {', '.join(named_configs()) or 'none'}, or give a path to a .yaml file"
        )
    return path


def _suggest(word: str, choices: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def load_config(
    overrides: Iterable[str] = (),
    config_name: str | None = None,
    resumed: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> JobConfig:
    """Resolve the configuration of a job; see the module docstring for the order.

    ``resumed`` is the config stored in a checkpoint being resumed: it comes after the YAML
    files and before the command line, so a resumed run keeps its settings unless overridden.
    ``values`` are keys given from Python (``Trainer(epochs=5)``): they act as command-line keys.
    """
    from ddprl import registry

    cli = {**(values or {}), **_parse_overrides(overrides)}
    resumed = dict(resumed or {})
    named: dict[str, Any] = {}
    if config_name:
        path = config_path(config_name)
        named = _read_yaml(path)

    def chosen(key: str, default: str) -> str:
        return str(cli.get(key, resumed.get(key, named.get(key, default))))

    algorithm = registry.get(chosen("algo", registry.DEFAULT_ALGO), chosen("engine", registry.DEFAULT_ENGINE))
    algo = algorithm.name
    defaults = algorithm.default_values()
    schema = algorithm.config
    fields = [f.name for f in public_fields(schema)]

    # (label for `sources`, name in error messages, values), applied in this order
    layers: list[tuple[str, str, dict[str, Any]]] = [("default", f"algo={algo}'s defaults", defaults)]
    task = cli.get("task", resumed.get("task", named.get("task", defaults.get("task"))))
    task_file = task_preset_file(task)
    if "task" in fields and task_file is not None:
        layers.append(("task preset", f"task/{task_file.name}", _task_preset(task_file, algo, registry.names())))
    if named:
        layers.append(("config file", f"{config_name}.yaml", named))
    if resumed:
        layers.append(("checkpoint", "the checkpoint's config", resumed))
    layers.append(("command line", "command line", cli))

    cfg = OmegaConf.structured(schema)
    sources = dict.fromkeys(fields, "default")
    for label, source, values in layers:
        for key, value in values.items():
            if key not in fields and not _is_dict_entry(schema, key):
                raise UsageError(f"unknown key {key!r} for algo={algo} (from {source}){_suggest(key, fields)}")
            try:
                OmegaConf.update(cfg, key, value, merge=False)
            except OmegaConfBaseException:
                expected = _field_type_name(schema, key)
                raise UsageError(f"{key}={value!r} ({source}): expected {expected}") from None
            except ValueError as e:
                raise UsageError(f"{key}={value!r} ({source}): {e}") from None
            sources[key.partition(".")[0]] = label
    OmegaConf.update(cfg, "algo", algo, merge=False)
    OmegaConf.update(cfg, "engine", algorithm.engine, merge=False)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise UsageError(f"no value for {', '.join(missing)} (algo={algo})")
    try:
        resolved = OmegaConf.to_object(cfg)  # runs the dataclass's __post_init__ range checks
    except OmegaConfBaseException as e:
        cause = e.__cause__ if isinstance(e.__cause__, UsageError) else None
        if cause is not None:
            raise cause from None
        raise UsageError(str(e).splitlines()[0]) from None
    resolved.sources = sources
    for plain, alternative in getattr(schema, "ALTERNATIVES", ()):
        _settle(resolved, plain, alternative)
    return resolved


LAYERS = ("default", "task preset", "config file", "checkpoint", "command line")  # later wins


def _settle(cfg: JobConfig, plain: str, alternative: str) -> None:
    """Two keys that set one size two ways (``batch_size``, or ``minibatches`` from which it is
    derived; ``alternative`` is null when unused): the one from the later layer wins, so a
    ``batch_size=`` of yours replaces a preset's ``minibatches`` and the other way round. Both
    from one layer: refused, except from the defaults (the schema's ``batch_size`` is no choice)
    and from a checkpoint (its plain value was derived): there the alternative wins."""
    if getattr(cfg, alternative) is None:
        return
    plain_from, alternative_from = cfg.sources[plain], cfg.sources[alternative]
    if LAYERS.index(plain_from) > LAYERS.index(alternative_from):
        setattr(cfg, alternative, None)
        cfg.sources[alternative] = plain_from
    elif plain_from == alternative_from and plain_from not in ("default", "checkpoint"):
        raise UsageError(
            f"{plain}={getattr(cfg, plain)} and {alternative}={getattr(cfg, alternative)} ({plain_from}) set "
            f"the same size two ways: give one"
        )


def _is_dict_entry(schema: type, key: str) -> bool:
    """``task_options.split_seed``: one entry of a dict-valued key, set on its own."""
    head, dot, _ = key.partition(".")
    return bool(dot) and any(f.name == head and str(f.type).startswith("dict") for f in dataclasses.fields(schema))


def _field_type_name(schema: type, key: str) -> str:
    for f in dataclasses.fields(schema):
        if f.name == key:
            t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(t, t)
    return "another type"


def to_dict(cfg: JobConfig) -> dict[str, Any]:
    """Plain dict of a config's keys (for config.yaml and checkpoints: primitives only)."""
    return {f.name: copy.deepcopy(getattr(cfg, f.name)) for f in public_fields(cfg)}


def save_yaml(cfg: JobConfig, path: Path) -> None:
    """The config as YAML, one key a line; a comment names where a value came from when it is
    not a default (``norm_obs: true  # task preset``). Written atomically (a full disk:
    :class:`~ddprl.errors.DiskFull`, the file as it was)."""
    from ddprl.files import write_text_atomically

    sources = cfg.sources
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=10**6)
    lines = []
    for line in text.splitlines():
        key = line.partition(":")[0]
        source = sources.get(key, "default") if not line.startswith(" ") else "default"
        lines.append(line if source == "default" else f"{line}  # {source}")
    write_text_atomically(path, "\n".join(lines) + "\n")


def describe(schema: type = JobConfig) -> list[tuple[str, str, str]]:
    """(key, type, help) for each field of a schema, without values."""
    return [(f.name, str(f.type), f.metadata.get("help", "")) for f in public_fields(schema)]


def key_rows(cfg: JobConfig) -> list[tuple[str, str, str, str]]:
    """(key, type, value, help) of every key of a resolved config (``load_config(...)``), values
    as the command line writes them: ``ddprl keys`` and ``ddprl train --help`` show the defaults
    of an algorithm (and task) this way."""
    return [
        (f.name, type_name(f), format_value(getattr(cfg, f.name)), f.metadata.get("help", ""))
        for f in public_fields(cfg)
    ]


def type_name(f: dataclasses.Field) -> str:
    """A field's type in the words of the command line: ``int | null``, ``list[int]``, ``dict``."""
    if "type_name" in f.metadata:
        return f.metadata["type_name"]
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    text = text.replace("typing.", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional[") : -1] + " | null"
    return "dict" if text.startswith("dict") else text


def format_value(value: Any) -> str:
    """A value as it is written after ``key=`` (Hydra's grammar): true, null, [64, 64], {a: 1}, ''."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)
