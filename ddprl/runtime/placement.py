"""Where is this process in the job? Launcher detection and placement, before any process group.

Pure functions of the environment variables and the config: unit-tested without processes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from ddprl.errors import UsageError
from ddprl.runtime import shm

if TYPE_CHECKING:
    from ddprl.runtime.protocol import LaunchConfig

Config = TypeVar("Config", bound="LaunchConfig")

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


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compact host list as host names: ``gpu[07-08,11],login1`` → gpu07 gpu08 gpu11 login1.

    The pure-Python reading of ``scontrol show hostnames``: comma-separated entries, each with
    any number of bracket groups of numbers and ranges (zero padding kept: ``[07-10]``).

    >>> expand_hostlist("gpu[07-08,11]")
    ['gpu07', 'gpu08', 'gpu11']
    >>> expand_hostlist("r[1-2]n[1-2],x")
    ['r1n1', 'r1n2', 'r2n1', 'r2n2', 'x']
    """
    hosts: list[str] = []
    for entry in _split_outside_brackets(hostlist.strip()):
        names = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", entry):
            if not literal and not group:
                continue
            choices = [literal + n for n in _expand_ranges(group, hostlist)] if group else [literal]
            names = [name + c for name in names for c in choices]
        hosts.extend(n for n in names if n)
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_ranges(group: str, hostlist: str) -> list[str]:
    out = []
    for item in group.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+))?", item.strip())
        if not m:
            raise UsageError(f"cannot read the SLURM host list {hostlist!r} (bracket item {item!r})")
        lo, hi, stride = m.group(1), m.group(2) or m.group(1), int(m.group(3) or 1)
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1, stride))
    return out


def slurm_hosts(environ: Mapping[str, str]) -> list[str]:
    """The hosts of this SLURM step (else job), in SLURM's order: ``scontrol`` when present (it
    knows site-specific syntax), the pure-Python expansion otherwise."""
    hostlist = (
        environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    )
    if not hostlist:
        return []
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, timeout=30
            )
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()
        except (OSError, subprocess.SubprocessError):
            pass
    return expand_hostlist(hostlist)


def slurm_tasks_per_node(environ: Mapping[str, str]) -> list[int]:
    """Tasks on each node of the step: SLURM writes ``4(x2)`` for 4,4 and ``2(x3),1`` for 2,2,2,1.

    >>> slurm_tasks_per_node({"SLURM_NTASKS_PER_NODE": "2(x3),1"})
    [2, 2, 2, 1]
    """
    text = (
        environ.get("SLURM_STEP_TASKS_PER_NODE")
        or environ.get("SLURM_TASKS_PER_NODE")
        or environ.get("SLURM_NTASKS_PER_NODE", "")
    )
    counts: list[int] = []
    for item in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise UsageError(f"cannot read SLURM's tasks per node {text!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _slurm_rendezvous(cfg: LaunchConfig, environ: Mapping[str, str]) -> tuple[int, str, int]:
    """(tasks on this node, master address, master port) of an srun task.

    Address: ``master_addr=`` given by the user, else an exported MASTER_ADDR, else the first
    host of the step's node list. Port: ``master_port=``, else MASTER_PORT, else 20000 + job id
    mod 20000 (every task derives the same one without talking).
    """
    world_size = int(environ["SLURM_NTASKS"])
    per_node = slurm_tasks_per_node(environ)
    node = int(environ.get("SLURM_NODEID", "0"))
    local_world_size = per_node[node] if node < len(per_node) else world_size
    addr = cfg.master_addr if cfg.master_addr != "auto" else environ.get("MASTER_ADDR", "")
    if not addr:
        hosts = slurm_hosts(environ)
        if not hosts:
            raise UsageError(
                "under SLURM, neither master_addr=, MASTER_ADDR nor SLURM_JOB_NODELIST names rank 0's "
                "host; pass master_addr=<host>"
            )
        addr = hosts[0]
    if str(cfg.master_port) != "auto":
        port = int(cfg.master_port)
    elif environ.get("MASTER_PORT"):
        port = int(environ["MASTER_PORT"])
    else:
        port = 20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000
    return local_world_size, addr, port


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


def check_device(device: str, cuda_count: int | None = None) -> None:
    """A UsageError when ``device=cuda`` and no CUDA device is visible."""
    cuda_count = torch.cuda.device_count() if cuda_count is None else cuda_count
    if device == "cuda" and cuda_count == 0:
        raise UsageError("device=cuda but no CUDA device is visible (check CUDA_VISIBLE_DEVICES); use device=cpu")


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
    check_device(device, cuda_count)
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


def rendezvous_from_env(
    cfg: LaunchConfig, environ: Mapping[str, str] = os.environ, local_rank: int | None = None
) -> Rendezvous:
    """This process's place from the launcher's variables (or the spawner's arguments)."""
    launcher = detect_launcher(environ)
    if launcher == "torchrun":
        # torchrun's agent serves the rendezvous store at MASTER_ADDR:MASTER_PORT: the workers
        # must meet there, so another address given to ddprl cannot be honoured.
        for name, value in (("master_addr", cfg.master_addr), ("master_port", cfg.master_port)):
            if str(value) != "auto" and str(value) != environ.get(name.upper()):
                raise UsageError(
                    f"{name}={value} under torchrun: torchrun sets the rendezvous; give it "
                    f"--{name.replace('_', '-')} instead and leave {name} out"
                )
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", "0"))
        local_world_size = int(environ.get("LOCAL_WORLD_SIZE", str(world_size)))
        addr, port = environ.get("MASTER_ADDR", "127.0.0.1"), int(environ.get("MASTER_PORT", "29500"))
    elif launcher == "slurm":
        rank, world_size = int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", "0"))
        local_world_size, addr, port = _slurm_rendezvous(cfg, environ)
    else:
        assert local_rank is not None, "spawn mode needs the local rank from the spawner"
        local_world_size = cfg.world_size // cfg.nnodes
        rank = cfg.node_rank * local_world_size + local_rank
        world_size = cfg.world_size
        addr, port = spawn_master_addr(cfg), int(cfg.master_port)
    return Rendezvous(launcher, rank, local_rank, world_size, local_world_size, addr, port)


def spawn_master_addr(cfg: LaunchConfig) -> str:
    """Rank 0's address in a spawn-mode job: this machine's loopback on one node; on several
    nodes the user must name it (nothing else could tell the nodes the same host)."""
    if cfg.master_addr != "auto":
        return cfg.master_addr
    if cfg.nnodes > 1:
        raise UsageError(
            f"nnodes={cfg.nnodes} needs master_addr=<rank 0's host> on every node "
            "(the same name or address each node can reach)"
        )
    return "127.0.0.1"


def placement_from_env(
    cfg: LaunchConfig, environ: Mapping[str, str] = os.environ, local_rank: int | None = None
) -> Placement:
    """Work out this process's place from the launcher's variables (or the spawner's arguments)."""
    r = rendezvous_from_env(cfg, environ, local_rank)
    device, backend = choose_device_and_backend(cfg.device, cfg.backend, r.local_rank, r.local_world_size)
    return Placement(
        r.launcher,
        r.rank,
        r.local_rank,
        r.world_size,
        r.local_world_size,
        r.master_addr,
        r.master_port,
        device,
        backend,
    )


def resolved_config(cfg: Config) -> Config:
    """``cfg`` with ``world_size=auto`` (and the sizes derived from it) made concrete.

    The JAX engine runs one process per machine (each driving all its devices): there
    ``auto`` is ``nnodes``.
    """
    if getattr(cfg, "engine", "torch") == "jax":
        return cfg.resolved(cfg.nnodes if cfg.world_size == "auto" else int(cfg.world_size))
    check_device(cfg.device)  # before anything asks the GPU for its memory (autoscale=true) or place
    resolved = cfg.resolved(resolve_world_size(cfg.world_size, cfg.device, cfg.nnodes))
    if cfg.world_size == "auto":  # config.yaml and the start-up line say the value was chosen here
        resolved = dataclasses.replace(resolved, sources={**resolved.sources, "world_size": "auto"})
    return resolved


def usable_cores() -> int:
    """Cores this process may run on (its affinity: a container's or SLURM's limit), not the
    machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_cores(placement: Placement, cpu_bind: str) -> list[int]:
    """The cores this rank may take as its own: its affinity where it is the node's only rank or
    ``cpu_bind=cores`` bound it to its share, else its :func:`core_share` of the affinity the
    node's ranks have in common (GPU ranks, ``cpu_bind=none``); none where ranks outnumber cores."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return []
    if placement.local_world_size == 1:
        return cores
    if cpu_bind == "cores" and placement.device.type == "cpu":  # bound by bind_cores, unless too few cores
        return cores if len(cores) * placement.local_world_size <= (os.cpu_count() or 1) else []
    return core_share(placement.local_rank, placement.local_world_size, cores) or []


def contiguous(cores: list[int]) -> bool:
    """Whether ``cores`` are numbered one after another (EnvPool pins its thread i to core offset + i)."""
    return bool(cores) and cores == list(range(cores[0], cores[0] + len(cores)))


def beside_cores(cores: list[int]) -> list[int] | None:
    """The cores for EnvPool's threads beside a rank acting on the first of ``cores``: the others,
    where they are contiguous (None: leave the threads unpinned).

    >>> beside_cores([4, 5, 6]), beside_cores([0, 2, 5]), beside_cores([3])
    ([5, 6], None, None)
    """
    return cores[1:] if contiguous(cores[1:]) else None


def core_share(local_rank: int, local_world_size: int, cores: list[int]) -> list[int] | None:
    """The cores of local rank ``local_rank`` when ``cores`` are split into ``local_world_size``
    contiguous, equal, disjoint shares (None when there are fewer cores than ranks). Contiguous
    numbers are distinct physical cores on Linux, which numbers hyperthread siblings last.

    >>> core_share(1, 2, [0, 1, 2, 3, 4]), core_share(0, 3, [0, 1])
    ([2, 3], None)
    """
    per_rank = len(cores) // local_world_size
    if per_rank == 0:
        return None
    return sorted(cores)[local_rank * per_rank : (local_rank + 1) * per_rank]


def bind_cores(mode: str, placement: Placement) -> list[int] | None:
    """``cpu_bind=cores``: keep this CPU rank, its threads and the processes it starts
    (environment workers) on its own share of this process's cores; the cores kept, or None
    when left as they are (``none``, a GPU rank, one rank, fewer cores than ranks).

    Not the default: on a 2-vCPU virtual machine PPO's ranks in lock step waited longer bound
    (docs/benchmarks.md, "Scaling"), a vCPU the host pauses holding its rank with it.
    """
    if mode != "cores" or placement.device.type != "cpu" or placement.local_world_size == 1:
        return None
    if not hasattr(os, "sched_setaffinity"):
        return None
    share = core_share(placement.local_rank, placement.local_world_size, list(os.sched_getaffinity(0)))
    if share is not None:
        os.sched_setaffinity(0, share)
    return share


def resolve_world_size(
    world_size: int | str, device: str, nnodes: int = 1, cuda_count: int | None = None, cores: int | None = None
) -> int:
    """``world_size=auto``: one rank per visible GPU (on each of ``nnodes`` machines) when the
    device is CUDA, else two CPU processes, or one where a single core is usable (two ranks on
    one core train slower than one). An explicit number is returned unchanged.

    >>> resolve_world_size("auto", "auto", cuda_count=0, cores=8), resolve_world_size("auto", "cuda", 2, cuda_count=4)
    (2, 8)
    """
    if world_size != "auto":
        return int(world_size)
    cuda_count = torch.cuda.device_count() if cuda_count is None else cuda_count
    use_cuda = device == "cuda" or (device == "auto" and cuda_count > 0)
    check_device(device, cuda_count)
    cores = usable_cores() if cores is None else cores
    return (cuda_count if use_cuda else max(1, min(CPU_WORLD_SIZE, cores))) * nnodes


def auto_world_size_note(world_size: int, device: str, nnodes: int = 1) -> str:
    """The start-up line that says what ``world_size=auto`` chose here (``device``: the key), and why."""
    if device == "cuda" or (device == "auto" and torch.cuda.device_count() > 0):
        return f"world_size=auto: {world_size} processes, one per visible GPU"
    per_node, cores = world_size // nnodes, usable_cores()
    if per_node == 1:
        return f"world_size=auto: 1 CPU process per machine: {cores} core usable here, and 2 ranks on it are slower"
    through = "shared memory" if shm.supported() is None else "gloo"
    return (
        f"world_size=auto: {per_node} CPU processes per machine, one a core ({cores} usable), reducing through "
        f"{through} (world_size=1 for one process)"
    )
