"""What a training job is resolved to before any process starts, below the command line and
the Python API alike (``ddprl train`` and ``ddprl.supervised.Trainer`` both call
:func:`prepare_train`): the config with the launcher's world size, a resumed run's settings, the
algorithm's own preparation, the checks and the warnings said once per job.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddprl import registry
from ddprl.errors import UsageError, first_process

# Settings of the interrupted job that must not carry over into a resumed one.
NOT_RESUMED = ("master_port", "master_addr", "node_rank", "resume", "run_dir")


def saved_config(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``config`` as the layer that a resumed, evaluated or played job builds on:
    without the interrupted job's own settings (NOT_RESUMED), and with every architecture key the
    checkpoint predates at the algorithm's default, the network its weights were made with (not
    at what a task preset might set today)."""
    algorithm = registry.get(config.get("algo"), str(config.get("engine", registry.DEFAULT_ENGINE)))
    defaults = algorithm.default_values()
    older = {k: defaults[k] for k in algorithm.architecture_keys if k not in config and k in defaults}
    return {**older, **{k: v for k, v in config.items() if k not in NOT_RESUMED}}


def envs_for_world(saved: dict[str, Any], cfg: Any, size: str) -> tuple[dict[str, Any], str | None]:
    """A checkpoint's global ``num_envs`` that does not split over this job's ranks (an elastic restart on another
    number of ranks) is rounded to the nearest multiple of them, and the line says so; a ``num_envs`` given on the
    command line is left to the usual check. ``cfg``: this job's keys before the checkpoint's are read, without its
    ``world_size``, ``size`` (a number or auto)."""
    from ddprl.runtime import resolved_config

    envs = saved.get("num_envs")
    if not isinstance(envs, int) or getattr(cfg, "engine", "torch") != "torch" or not hasattr(cfg, "num_envs"):
        return saved, None
    if cfg.sources.get("num_envs") == "command line":
        return saved, None
    world_size = int(size) if size.isdigit() else resolved_config(dataclasses.replace(cfg, num_envs=None)).world_size
    if envs % world_size == 0:
        return saved, None
    fitted = max(world_size, round(envs / world_size) * world_size)
    return {**saved, "num_envs": fitted}, (
        f"num_envs={envs} of the checkpoint does not split over {world_size} ranks: num_envs={fitted} "
        f"({fitted // world_size} per rank)"
    )


def same_global_batch(cfg: Any, saved: dict[str, Any], saved_world_size: int) -> tuple[Any, str | None]:
    """A run resumed on another number of ranks keeps the samples behind each optimizer step: ``batch_size`` is
    per rank, so it is scaled by saved/new ranks (where that is whole); the line that says so, or why not. A
    ``batch_size`` or ``sync_freq`` other than the checkpoint's is the user's choice and stays as given (the same
    value given again, as a requeued job's command does, is not)."""
    world_size = cfg.world_size
    if world_size == saved_world_size or not hasattr(cfg, "batch_size"):
        return cfg, None
    if any(getattr(cfg, key) != saved.get(key, getattr(cfg, key)) for key in ("batch_size", "sync_freq")):
        return cfg, None
    ranks = f"a {saved_world_size}-rank run on {world_size} rank{'s' if world_size > 1 else ''}"
    if cfg.PER_RANK_BATCH:
        return cfg, f"resuming {ranks}: batch_size={cfg.batch_size} per rank stays: {cfg.PER_RANK_BATCH}"
    total = cfg.batch_size * saved_world_size  # per optimizer step, sync_freq aside (the same on both sides)
    if total % world_size:
        now = cfg.batch_size * world_size
        return cfg, (
            f"resuming {ranks}: batch_size={cfg.batch_size} per rank stays, {total * cfg.sync_freq} samples an "
            f"optimizer step become {now * cfg.sync_freq} ({total} do not split over {world_size} ranks; "
            "another batch_size= sets it)"
        )
    scaled = dataclasses.replace(cfg, batch_size=total // world_size)
    scaled.sources = {**cfg.sources, "batch_size": "checkpoint"}
    return scaled, (
        f"resuming {ranks}: batch_size={cfg.batch_size} -> {scaled.batch_size} per rank, the same "
        f"{total * cfg.sync_freq} samples an optimizer step over all ranks (another batch_size= sets it)"
    )


def key_values(args: list[str], allowed: dict[str, Callable[[str], Any]], command: str) -> dict[str, Any]:
    """Parse ``key=value`` arguments of the small commands (eval, doctor)."""
    import difflib

    values: dict[str, Any] = {}
    for arg in args:
        if "=" not in arg:
            raise UsageError(f"{command}: expected key=value, got {arg!r}")
        key, value = arg.split("=", 1)
        if key not in allowed:
            near = difflib.get_close_matches(key, list(allowed), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise UsageError(f"{command}: unknown key {key!r}{hint}; keys: {', '.join(allowed)}")
        try:
            values[key] = allowed[key](value)
        except ValueError:
            raise UsageError(f"{command}: {key}={value!r} is not a valid {allowed[key].__name__}") from None
    return values


def launcher_overrides(overrides: list[str]) -> list[str]:
    """Under torchrun/srun the launcher fixes world_size: take it (or refuse a contradiction)."""
    from ddprl.runtime import detect_launcher

    launcher = detect_launcher()
    if launcher == "spawn":
        return overrides
    actual = int(os.environ["WORLD_SIZE"] if launcher == "torchrun" else os.environ["SLURM_NTASKS"])
    for o in overrides:
        if o.startswith("world_size=") and o.split("=", 1)[1] != str(actual):
            raise UsageError(f"{o} contradicts the {launcher} launcher's world size {actual}; drop world_size=")
    return [o for o in overrides if not o.startswith("world_size=")] + [f"world_size={actual}"]


def prepare_train(
    overrides: list[str], config_name: str | None, values: dict[str, Any] | None = None, prepare_hook: bool = True
):
    """Resolve and check everything a training job needs before any process starts.

    ``values``: keys given from Python (the supervised Trainer), like command-line keys;
    ``prepare_hook=False`` skips the algorithm's command-line preparation (the Trainer's task
    comes as Python objects, not as a name to import).
    """
    from ddprl.checkpoint import load_checkpoint, resolve_resume, run_dir_of_checkpoint
    from ddprl.config import load_config, preset_note
    from ddprl.runlock import holds_the_lock, refuse_if_in_use
    from ddprl.runtime import resolved_config

    overrides = launcher_overrides(overrides)
    sizes = [o.split("=", 1)[1] for o in overrides if o.startswith("world_size=")]
    # what to resume, before the sizes are checked: a checkpoint's num_envs may have to fit another world size
    unsized = [o for o in overrides if not o.startswith("world_size=")] + ["world_size=auto"]  # whatever a file says
    first = load_config(unsized, config_name, values=values)
    cfg = first if sizes else load_config(overrides, config_name, values=values)
    algorithm = registry.get(cfg.algo, cfg.engine)
    ckpt_path = resolve_resume(cfg.resume, cfg.run_dir, cfg.algo)
    if ckpt_path is None and sizes:
        cfg = load_config(overrides, config_name, values=values)
    notes: list[str] = []  # what a resume on another number of ranks changed, said once
    if ckpt_path is not None:
        saved = saved_config(load_checkpoint(ckpt_path, expect_algo=cfg.algo)["config"])
        # the job's world size: the command line's (a launcher's), else the checkpoint's own
        saved, note = envs_for_world(saved, first, sizes[-1] if sizes else str(saved.get("world_size", "auto")))
        notes += [note] if note else []
        cfg = load_config(overrides, config_name, resumed=saved, values=values)
        if getattr(cfg, "task", None) != saved.get("task"):
            raise UsageError(f"resume: checkpoint {ckpt_path} is for task={saved['task']}, not task={cfg.task}")
        for key in algorithm.architecture_keys:
            if key in saved and getattr(cfg, key) != saved[key]:  # (a key newer than the checkpoint: its default)
                raise UsageError(
                    f"resume: {key}={getattr(cfg, key)!r} differs from the checkpoint's {saved.get(key)!r}"
                )
        run_dir = cfg.run_dir or str(run_dir_of_checkpoint(ckpt_path))
        cfg = dataclasses.replace(cfg, resume=str(ckpt_path), run_dir=run_dir)
    elif cfg.resume:  # resume=auto with nothing to resume yet
        cfg = dataclasses.replace(cfg, resume="")
    if cfg.run_dir and holds_the_lock(cfg):
        refuse_if_in_use(Path(cfg.run_dir))  # before the checks: a job refused says only that
    cfg = resolved_config(cfg)
    if ckpt_path is not None:
        ckpt = load_checkpoint(ckpt_path)  # read once per process: the same dict as above
        cfg, note = same_global_batch(cfg, ckpt["config"], int(ckpt["world_size"]))
        notes += [note] if note else []
    prepare = algorithm.prepare_fn() if prepare_hook else None
    if prepare is not None:
        cfg = prepare(cfg, overrides, config_name, ckpt_path is not None)
    warnings = cfg.check()
    if first_process():  # said once per job
        preset = preset_note(cfg)
        if preset:
            print(f"ddprl: {preset}", file=sys.stderr, flush=True)
        for line in notes:
            print(f"ddprl: {line}", file=sys.stderr, flush=True)
        for line in warnings:
            print(f"ddprl: warning: {line}", file=sys.stderr, flush=True)
    if cfg.enable_wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise UsageError("enable_wandb=true needs the wandb package: pip install 'ddprl[wandb]'") from None
    return cfg
