"""Hardware-facing helpers: GPU metrics and ``autoscale`` (sizes chosen from the device's memory)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ddprl.runtime.protocol import JobRuntime


class PolicySizes(Protocol):
    """The keys :func:`autoscale_ppo` reads (PPO's config, either engine's)."""

    device: str
    policy: str
    policy_width: int
    policy_depth: int
    hidden_sizes: list[int]


def gpu_stats(device: torch.device) -> dict[str, float]:
    """This rank's GPU: utilisation % (needs nvidia-ml-py) and memory allocated by torch (GB).

    Empty on the CPU. A value that can't be read is absent, never reported as zero.
    """
    if device.type != "cuda":
        return {}
    stats = {"memory_allocated_gb": torch.cuda.memory_allocated(device) / 1e9}
    try:
        # torch maps the index through CUDA_VISIBLE_DEVICES to NVML's physical numbering.
        stats["util_percent"] = float(torch.cuda.utilization(device))
    except Exception:  # nvidia-ml-py not installed, or NVML unavailable
        pass
    return stats


def bf16_units(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """What computes bf16 faster than fp32 on ``device``, in words, or None: a GPU of compute capability 8.0 or
    later (tensor cores), a CPU with AMX or AVX512_BF16 (read from /proc/cpuinfo's flags, Linux only)."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        return "bf16 tensor cores" if major >= 8 else None
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    return "AMX" if "amx_bf16" in flags else "AVX512_BF16" if "avx512_bf16" in flags else None


def system_metrics(rt: JobRuntime) -> dict[str, float]:
    """Collective on CUDA (every rank's GPU stats, keyed by global rank); {} on the CPU."""
    if rt.device.type != "cuda":
        return {}
    per_rank = rt.all_gather_object(gpu_stats(rt.device))
    return {f"system/gpu{rank}_{k}": v for rank, stats in enumerate(per_rank) for k, v in stats.items()}


def _pow2_floor(x: float) -> int:
    return 2 ** int(math.floor(math.log2(max(1.0, x))))


def autoscale_ppo(
    cfg: PolicySizes,
    obs_shape: tuple[int, ...],
    world_size: int,
    local_world_size: int,
    fixed: dict[str, int] | None = None,
    device: str | None = None,
) -> dict[str, int]:
    """Sizes for PPO from the device (the rule of docs/ppo.md, Snake, `autoscale=true`).

    CUDA, per rank, with M = 0.3 x the GPU's *total* memory / ranks sharing it (total, not
    free, so every rank of a job computes the same numbers):
      - rollout bytes per sample r = 3 x 4 x prod(obs_shape) + 64 (stored obs, the flattened
        and the normalised copies, the scalars);
      - local envs = largest power of two with envs x n_steps x r <= M, in [64, 65536], with
        n_steps = 128, or 64 once that gives >= 4096 envs (shorter rollouts keep updates
        frequent when each holds millions of samples);
      - batch_size = largest power of two <= rollout / 4 with batch x activation bytes <= M.
    CPU: 128 envs per rank, n_steps 128, batch = rollout / 4 (compute, not memory, limits).
    Values in ``fixed`` (the keys the user set) are kept and the others sized around them.
    Returns global ``num_envs``, ``n_steps`` and per-rank ``batch_size``.
    """
    fixed = fixed or {}
    chosen = _autoscale_sizes(cfg, obs_shape, world_size, local_world_size, fixed, device)
    chosen.update(fixed)
    rollout = chosen["num_envs"] // world_size * chosen["n_steps"]
    if "batch_size" not in fixed:  # never a minibatch larger than the rollout it splits
        chosen["batch_size"] = max(1, min(chosen["batch_size"], _pow2_floor(rollout / 4)))
    return chosen


def _autoscale_sizes(
    cfg: PolicySizes,
    obs_shape: tuple[int, ...],
    world_size: int,
    local_world_size: int,
    fixed: dict[str, int],
    device: str | None,
) -> dict[str, int]:
    use_cuda = (device or cfg.device) == "cuda" or ((device or cfg.device) == "auto" and torch.cuda.is_available())
    if not use_cuda:
        n_steps, local_envs = 128, 128
        return {"num_envs": local_envs * world_size, "n_steps": n_steps, "batch_size": local_envs * n_steps // 4}
    gpus = max(1, torch.cuda.device_count())
    ranks_per_gpu = max(1, math.ceil(local_world_size / gpus))
    budget = 0.3 * torch.cuda.get_device_properties(0).total_memory / ranks_per_gpu
    obs_numel = math.prod(obs_shape)
    per_sample = 3 * 4 * obs_numel + 64
    n_steps = fixed.get("n_steps", 128)
    local_envs = min(65536, max(64, _pow2_floor(budget / (n_steps * per_sample))))
    if local_envs >= 4096 and "n_steps" not in fixed:
        n_steps = 64
        local_envs = min(65536, max(64, _pow2_floor(budget / (n_steps * per_sample))))
    if cfg.policy == "cnn":
        activation = (
            4
            * 3
            * (cfg.policy_width * obs_numel // max(1, obs_shape[0]) * 2 * cfg.policy_depth + sum(cfg.hidden_sizes))
        )
    else:
        activation = 4 * 6 * (sum(cfg.hidden_sizes) + obs_numel)
    rollout = local_envs * n_steps
    batch = min(_pow2_floor(rollout / 4), _pow2_floor(budget / activation))
    return {"num_envs": local_envs * world_size, "n_steps": n_steps, "batch_size": max(1, batch)}
