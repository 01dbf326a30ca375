"""Whether a kept run still is what its row runs: :func:`stale_keys` sets its ``config.yaml`` against the config
the row's keys resolve to now (presets change after runs are kept); ``run.py --stale`` lists the stale runs. Where
each run came from is its ``provenance.json`` (``store.write_provenance``)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from . import rows as R
from . import store
from .training import COMMON

# keys that differ from run to run of one configuration without changing a number it computes: the seed (each run's
# own), where it writes and resumes, the rendezvous, the stuck-collective timeout, the progress bar, which checkpoints
# are written and kept (they only decide when to save), W&B logging, and the allocator and core binding (speed only)
PER_RUN = {"seed", "run_dir", "resume", "master_addr", "master_port", "node_rank", "dist_timeout", "progress"}
PER_RUN |= {"checkpoint_freq", "checkpoint_buffer", "keep_last", "enable_wandb", "wandb_project", "wandb_entity"}
PER_RUN |= {"wandb_mode", "malloc", "cpu_bind"}
# how the update runs, not what it computes (eager and compiled steps are held to the same numbers by tests): PPO's
# compile=auto since, and an explicit compile=false before, run the same algorithm
PER_RUN |= {"compile"}
# how a rank's Atari games step (together, or in two halves beside acting), not which transitions they give (a test)
PER_RUN |= {"env_overlap"}
# checkpoints a kept run read from where they were before they were committed: the same file (the stages were trained
# once, then moved into runs/), so a run that read it there ran what its row now gives
MOVED = dict.fromkeys(
    (
        "/work/runs/3m-sight6/seed1/mask_predictor_small30/checkpoints/best.pt",
        "/work/main/benchmarks/results/runs/qmix-smax-3m-sight6/stages/mask_predictor/best.pt",
    ),
    f"{R.STAGES}/mask_predictor/best.pt",
)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: six times as fast over every kept run


def kept_runs() -> list[tuple[str, Path]]:
    """(row, folder) of every kept run: each folder holding a metrics file under ``runs/<row>/`` (``seed<K>``,
    ``<impl>-seed<K>``, ``in_progress/``, ``lost/``, the reconstructer's stages)."""
    found = {path.parent for path in store.RUNS.rglob("metrics.jsonl*")}
    return sorted((path.relative_to(store.RUNS).parts[0], path) for path in found)


def row_keys(name: str, impl: str) -> tuple[str, ...] | None:
    """The ``ddprl train`` keys of a row (``impl``: a peer row's engine), None where ddprl does not run it."""
    if name in R.PEER_ROWS:
        return R.PEER_ROWS[name].keys(impl) if impl in R.PEER_ROWS[name].ddprl_impls else None
    row = R.ROWS.get(name) or R.SUPERVISED_ROWS.get(name)
    return row.keys if row and not impl else None


@functools.cache  # one resolution a row, however many seeds
def config_now(name: str, impl: str = "") -> dict | None:
    """What the row's keys give now, as a kept ``config.yaml`` reads back (sizes resolved, as ``ddprl train``
    does before it writes it; the keys ``training.train_and_keep`` adds)."""
    from ddprl.config import load_config, to_dict

    if (keys := row_keys(name, impl)) is None:
        return None
    common = [key for key in COMMON if key.split("=")[0] not in {k.split("=")[0] for k in keys}]
    cfg = load_config([*keys, *common])
    cfg = cfg.resolved(int(cfg.world_size) if str(cfg.world_size).isdigit() else cfg.nnodes)  # jax: auto = nnodes
    return yaml.load(yaml.safe_dump(to_dict(cfg)), LOADER)  # YAML's types, as the kept file's


def stale_keys(row_name: str, seed_dir: Path) -> list[str]:
    """``key: kept -> now`` for each key of the run in ``seed_dir`` whose value the row no longer gives; keys on
    one side only (options added or removed since) and :data:`PER_RUN` are left out. Nothing for a run without a
    ddprl config (a peer library's)."""
    impl = seed_dir.name.rpartition("-seed")[0]  # a peer row's jax1-seed1: jax1
    now = config_now(row_name, impl) if (seed_dir / "config.yaml").exists() else None
    if now is None:
        return []
    kept = yaml.load((seed_dir / "config.yaml").read_text(), LOADER)
    kept = {key: MOVED.get(value, value) if isinstance(value, str) else value for key, value in kept.items()}
    changed = [key for key in kept if key in now and key not in PER_RUN and kept[key] != now[key]]
    return [f"{key}: {kept[key]} -> {now[key]}" for key in changed]


def stale_runs() -> list[tuple[Path, list[str]]]:
    """Each kept run whose row now gives other values, with :func:`stale_keys`."""
    return [(folder, keys) for name, folder in kept_runs() if (keys := stale_keys(name, folder))]
