"""``autoscale=true``: PPO's sizes chosen from the device's memory, before any process starts."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from ddprl.config import load_config
from ddprl.envs import make_env
from ddprl.runtime import detect_launcher
from ddprl.system import autoscale_ppo

if TYPE_CHECKING:
    from ddprl.algos.ppo.config import PPOConfig


def prepare(cfg: PPOConfig, overrides: list[str], config_name: str | None, resuming: bool) -> PPOConfig:
    """Re-resolve the config with autoscaled sizes beneath the user's own ``key=value``s.

    A resumed run keeps its checkpoint's sizes: nothing is chosen anew.
    """
    if not cfg.autoscale or resuming:
        return cfg
    probe = make_env(cfg.task, 1, seed=0, device="cpu", backend=cfg.env_backend, **cfg.env_kwargs)
    obs_shape = tuple(probe.single_observation_space.shape)
    probe.close()
    if detect_launcher() == "spawn":
        local_world_size = cfg.world_size // cfg.nnodes
    else:
        local_world_size = int(
            os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
        )
    user_keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    fixed = {k: getattr(cfg, k) for k in ("num_envs", "n_steps", "batch_size") if k in user_keys}
    chosen = autoscale_ppo(cfg, obs_shape, cfg.world_size, local_world_size, fixed=fixed)
    auto = {k: v for k, v in chosen.items() if k not in user_keys}  # what the user set wins
    if cfg.minibatches is not None:  # batch_size follows from the sizes chosen here
        auto.pop("batch_size", None)
    if os.environ.get("RANK", "0") == "0":
        print("ddprl: autoscale set " + " ".join(f"{k}={v}" for k, v in auto.items()), file=sys.stderr, flush=True)
    return load_config(
        [f"{k}={v}" for k, v in auto.items()] + overrides + [f"world_size={cfg.world_size}"], config_name
    ).resolved(cfg.world_size)
