"""Where is this process in the job? Launcher detection and placement, before any process group.

Pure functions of the environment variables and the config: unit-tested without processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ddprl.errors import UsageError

CPU_WORLD_SIZE = 2  # world_size=auto without CUDA: two CPU processes (the default job's DDP on a laptop)


@dataclass(frozen=True)
class Placement:
    """Who this process is in the job, and what it runs on."""

    launcher: str  # "spawn" | "torchrun" | "slurm"
    rank: int  # global rank: seeds and "who writes" depend on it, never on local_rank
    local_rank: int  # index on this node: picks the GPU
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    device: torch.device
    backend: str  # "nccl" | "gloo"


def detect_launcher(environ: Mapping[str, str] = os.environ) -> str:
    """``torchrun`` when its variables are set, ``slurm`` under ``srun`` with >1 task, else ``spawn``."""
    if "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ):
        return "torchrun"
    if int(environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ:
        return "slurm"
    return "spawn"


def _slurm_master_addr(environ: Mapping[str, str]) -> str:
    """First host of the job's node list (``scontrol`` expands ranges like ``node[01-04]``)."""
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return "127.0.0.1"
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return nodelist.split(",")[0].split("[")[0]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Raise a UsageError naming the port when something already listens on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("localhost",) else "127.0.0.1", port))
        except OSError as e:
            raise UsageError(
                f"master_port={port} is already in use on {host} ({e.strerror}); "
                "pick another port or use master_port=auto"
            ) from None


def choose_device_and_backend(
    device: str, backend: str, local_rank: int, local_world_size: int, cuda_count: int | None = None
) -> tuple[torch.device, str]:
    """Map (device, backend) settings to this rank's device and the process-group backend.

    ``device=auto`` takes CUDA when present. A rank gets ``cuda:<local_rank>``; when there are
    fewer GPUs than local ranks they may share GPUs only under gloo (NCCL refuses two ranks on
    one GPU). ``backend=auto`` is NCCL when every local rank owns a distinct GPU, gloo otherwise.
    """
    cuda_count = torch.cuda.device_count() if cuda_count is None else cuda_count
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"device={device!r} is not one of auto, cpu, cuda")
    if backend not in ("auto", "nccl", "gloo"):
        raise UsageError(f"backend={backend!r} is not one of auto, nccl, gloo")
    use_cuda = device == "cuda" or (device == "auto" and cuda_count > 0)
    if device == "cuda" and cuda_count == 0:
        raise UsageError("device=cuda but no CUDA device is visible (check CUDA_VISIBLE_DEVICES); use device=cpu")
    if not use_cuda:
        if backend == "nccl":
            raise UsageError("backend=nccl needs CUDA devices; use backend=gloo or device=cuda")
        return torch.device("cpu"), "gloo"
    shared = local_world_size > cuda_count
    if shared:
        if backend == "nccl":
            raise UsageError(
                f"backend=nccl with {local_world_size} ranks on {cuda_count} GPU(s): NCCL cannot put two ranks "
                "on one GPU; lower world_size or use backend=gloo"
            )
        if backend == "auto":
            raise UsageError(
                f"world_size asks for {local_world_size} ranks per node but only {cuda_count} GPU(s) are visible "
                "with device=cuda; lower world_size, or set backend=gloo to let ranks share GPUs"
            )
    chosen = backend if backend != "auto" else "nccl"
    return torch.device("cuda", local_rank % cuda_count), chosen


@dataclass(frozen=True)
class Rendezvous:
    """Who this process is among the job's processes and where they meet (any engine)."""

    launcher: str  # "spawn" | "torchrun" | "slurm"
    rank: int  # global rank: seeds and "who writes" depend on it, never on local_rank
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int


def rendezvous_from_env(cfg: Any, environ: Mapping[str, str] = os.environ,
                        local_rank: int | None = None) -> Rendezvous:
    """This process's place from the launcher's variables (or the spawner's arguments)."""
    launcher = detect_launcher(environ)
    if launcher == "torchrun":
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", "0"))
        local_world_size = int(environ.get("LOCAL_WORLD_SIZE", str(world_size)))
        addr, port = environ.get("MASTER_ADDR", "127.0.0.1"), int(environ.get("MASTER_PORT", "29500"))
    elif launcher == "slurm":
        rank, world_size = int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", "0"))
        local_world_size = int(environ.get("SLURM_NTASKS_PER_NODE", str(world_size)).split("(")[0])
        addr = environ.get("MASTER_ADDR") or (cfg.master_addr if cfg.master_addr != "auto" else _slurm_master_addr(environ))
        port_setting = environ.get("MASTER_PORT") or str(cfg.master_port)
        # Every task must agree on the port without talking: derive it from the job id.
        port = int(port_setting) if port_setting != "auto" else 20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000
    else:
        assert local_rank is not None, "spawn mode needs the local rank from the spawner"
        local_world_size = cfg.world_size // cfg.nnodes
        rank = cfg.node_rank * local_world_size + local_rank
        world_size = cfg.world_size
        addr, port = cfg.master_addr, int(cfg.master_port)
    return Rendezvous(launcher, rank, local_rank, world_size, local_world_size, addr, port)


def placement_from_env(cfg: Any, environ: Mapping[str, str] = os.environ, local_rank: int | None = None) -> Placement:
    """Work out this process's place from the launcher's variables (or the spawner's arguments)."""
    r = rendezvous_from_env(cfg, environ, local_rank)
    device, backend = choose_device_and_backend(cfg.device, cfg.backend, r.local_rank, r.local_world_size)
    return Placement(r.launcher, r.rank, r.local_rank, r.world_size, r.local_world_size, r.master_addr,
                     r.master_port, device, backend)


def resolved_config(cfg: Any) -> Any:
    """``cfg`` with ``world_size=auto`` (and the sizes derived from it) made concrete.

    The JAX engine runs one process per machine (each driving all its devices): there
    ``auto`` is ``nnodes``.
    """
    if getattr(cfg, "engine", "torch") == "jax":
        return cfg.resolved(cfg.nnodes if cfg.world_size == "auto" else int(cfg.world_size))
    return cfg.resolved(resolve_world_size(cfg.world_size, cfg.device, cfg.nnodes))


def resolve_world_size(world_size: int | str, device: str, nnodes: int = 1, cuda_count: int | None = None) -> int:
    """``world_size=auto``: one rank per visible GPU (on each of ``nnodes`` machines) when the
    device is CUDA, else two CPU processes. An explicit number is returned unchanged.

    >>> resolve_world_size("auto", "auto", cuda_count=0), resolve_world_size("auto", "cuda", 2, cuda_count=4)
    (2, 8)
    """
    if world_size != "auto":
        return int(world_size)
    cuda_count = torch.cuda.device_count() if cuda_count is None else cuda_count
    use_cuda = device == "cuda" or (device == "auto" and cuda_count > 0)
    if device == "cuda" and cuda_count == 0:
        raise UsageError("device=cuda but no CUDA device is visible (check CUDA_VISIBLE_DEVICES); use device=cpu")
    return (cuda_count if use_cuda else CPU_WORLD_SIZE) * nnodes
