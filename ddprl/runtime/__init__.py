"""The distributed runtime: the only package of ddprl that imports ``torch.distributed``.

Algorithms see a :class:`Runtime` and its few verbs; they never touch process groups.

    def train(rt: Runtime, cfg):
        model = rt.wrap(MyNet())                 # DDP (+ torch.compile), weights broadcast
        loss = model(batch).mean(); loss.backward()
        mean_loss = rt.all_reduce_mean(loss.detach())
        ...

    launch(train, cfg)   # spawns cfg.world_size processes, or attaches to torchrun / SLURM

Modules: ``placement`` (who am I, which device: pure functions), ``launch`` (spawn / torchrun /
SLURM, a rank's life cycle, exit), ``collectives`` (the Runtime and its verbs), ``seeding``
(every seed from seed, rank, purpose), ``nccl`` (interconnect presets), ``compat`` (torch
features detected, not assumed), ``protocol`` (:class:`JobRuntime`: what either engine's runtime
offers ``Run``, checkpoints and evaluation).
"""

from ddprl.runtime.collectives import Runtime, parameter_checksum, unwrap
from ddprl.runtime.launch import (
    RankFailed,
    exit_process,
    launch,
    prepare_spawn,
    runs_in_this_process,
    setup_logging,
    spawn,
)
from ddprl.runtime.nccl import NCCL_PRESETS, apply_nccl_preset
from ddprl.runtime.placement import (
    Placement,
    check_port_free,
    choose_device_and_backend,
    detect_launcher,
    free_port,
    placement_from_env,
    resolve_world_size,
    resolved_config,
)
from ddprl.runtime.protocol import JobRuntime
from ddprl.runtime.seeding import Seeds, env_seed

__all__ = [
    "Runtime",
    "JobRuntime",
    "launch",
    "exit_process",
    "prepare_spawn",
    "runs_in_this_process",
    "RankFailed",
    "spawn",
    "setup_logging",
    "unwrap",
    "parameter_checksum",
    "Placement",
    "detect_launcher",
    "placement_from_env",
    "choose_device_and_backend",
    "free_port",
    "check_port_free",
    "resolve_world_size",
    "resolved_config",
    "NCCL_PRESETS",
    "apply_nccl_preset",
    "Seeds",
    "env_seed",
]
