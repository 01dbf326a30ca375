"""The distributed runtime: the only module of ddprl that imports ``torch.distributed``.

Algorithms see a ``Runtime`` and its few verbs; they never touch process groups.

    def train(rt: Runtime, cfg):
        model = rt.wrap(MyNet())                 # DDP (+ torch.compile), weights broadcast
        loss = model(batch).mean(); loss.backward()
        mean_loss = rt.all_reduce_mean(loss.detach())
        ...

    launch(train, cfg)   # spawns cfg.world_size processes, or attaches to torchrun / SLURM

Launch modes, decided by :func:`detect_launcher`:
- ``torchrun``: RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are set by the launcher.
- ``slurm``: one process per task started by ``srun`` (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID).
- ``spawn``: ``ddprl train world_size=N`` starts N local processes itself (``nnodes``/``node_rank``
  with ``master_addr``/``master_port`` spread one job over several machines).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import logging
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddprl.errors import UsageError

log = logging.getLogger("ddprl")

# Set once DDP has wrapped a module in this process; see ``exit_process``.
_ddp_used = False

Number = float | int


# ----------------------------------------------------------------------------------------
# Where am I? (launcher detection and placement, computed before any process group exists)


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


def placement_from_env(cfg: Any, environ: Mapping[str, str] = os.environ, local_rank: int | None = None) -> Placement:
    """Work out this process's place from the launcher's variables (or the spawner's arguments)."""
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
    device, backend = choose_device_and_backend(cfg.device, cfg.backend, local_rank, local_world_size)
    return Placement(launcher, rank, local_rank, world_size, local_world_size, addr, port, device, backend)


# NCCL settings per interconnect (nccl_preset=...). Applied only where the user's environment
# has no value: an exported variable always wins.
NCCL_PRESETS: dict[str, dict[str, str]] = {
    "none": {},
    # one node, GPUs joined by NVLink/NVSwitch: peer-to-peer over NVLink, NVLink SHARP where the
    # switch has it, no InfiniBand (nothing leaves the node).
    "nvlink": {"NCCL_P2P_LEVEL": "NVL", "NCCL_NVLS_ENABLE": "1", "NCCL_IB_DISABLE": "1",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"},
    # several nodes over InfiniBand: IB on, GPUDirect RDMA through the host bridge, bootstrap
    # sockets off loopback and docker bridges.
    "ib": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_SOCKET_IFNAME": "^lo,docker",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"},
}


def apply_nccl_preset(preset: str, environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """Set the preset's NCCL variables that ``environ`` lacks; return what was set."""
    if preset not in NCCL_PRESETS:
        raise UsageError(f"nccl_preset={preset!r} is not one of {', '.join(NCCL_PRESETS)}")
    chosen = {k: v for k, v in NCCL_PRESETS[preset].items() if k not in environ}
    environ.update(chosen)
    return chosen


# ----------------------------------------------------------------------------------------
# The runtime object


class RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_logging(rank: int) -> None:
    """``[RANK r]`` prefix on every line; rank 0 speaks at INFO, the others only warn."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[RANK %(rank)s] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.addFilter(RankFilter(rank))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False


class Runtime:
    """Rank, world and device of this process, and the collective verbs algorithms may use.

    Every collective has the timeout ``dist_timeout`` given at start (DESIGN.md invariant 9),
    and ``world_size=1`` goes through the same code (a process group of one).
    """

    def __init__(self, placement: Placement, dist_timeout: float):
        self.placement = placement
        self.rank = placement.rank
        self.local_rank = placement.local_rank
        self.world_size = placement.world_size
        self.device = placement.device
        self.backend = placement.backend
        self.is_main = self.rank == 0
        self.timeout = datetime.timedelta(seconds=dist_timeout)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # Under torchrun, env:// reuses the store its agent already serves on MASTER_PORT.
        init_method = ("env://" if placement.launcher == "torchrun"
                       else f"tcp://{_url_host(placement.master_addr)}:{placement.master_port}")
        dist.init_process_group(
            backend=self.backend,
            init_method=init_method,
            rank=self.rank,
            world_size=self.world_size,
            timeout=self.timeout,
        )

    # -- modules ---------------------------------------------------------------------------

    def wrap(self, module: nn.Module, compile: bool = False, find_unused_parameters: bool = False) -> nn.Module:
        """Move ``module`` to this rank's device and wrap it in DDP (then ``torch.compile``).

        DDP broadcasts rank 0's parameters and buffers at construction, so every rank starts
        from the same weights; derive targets/EMA copies *after* this call (invariant 2).
        Buffers are not re-broadcast on every forward (``forward_sync_buffers=False``): running
        statistics are reduced explicitly by the algorithm, never silently overwritten.

        >>> net = rt.wrap(nn.Linear(4, 2))      # doctest: +SKIP
        """
        module = module.to(self.device)
        has_trainable = any(p.requires_grad for p in module.parameters())
        # A world of one has nothing to average: DDP would only add its hooks and a gloo
        # all-reduce per backward (measured: ~2x slower PPO updates on CartPole). The loop is
        # the same either way; only the wrapper is skipped.
        if has_trainable and self.world_size > 1:
            global _ddp_used
            _ddp_used = True
            module = DDP(
                module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                forward_sync_buffers=False,
                find_unused_parameters=find_unused_parameters,
            )
        if compile:
            module = torch.compile(module)
        return module

    @staticmethod
    def unwrap(module: nn.Module) -> nn.Module:
        """The plain module inside DDP and ``torch.compile`` wrappers, in any nesting order."""
        return unwrap(module)

    @staticmethod
    def no_sync(module: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Skip DDP's gradient all-reduce inside the block when ``enabled`` (grad accumulation).

        >>> with rt.no_sync(model, enabled=not last_micro_step):   # doctest: +SKIP
        ...     loss.backward()
        """
        inner = module._orig_mod if hasattr(module, "_orig_mod") else module
        if enabled and isinstance(inner, DDP):
            return inner.no_sync()
        return contextlib.nullcontext()

    # -- collectives ------------------------------------------------------------------------

    def all_reduce_sum(self, value: Any) -> Any:
        """Sum over ranks of a tensor, a Python number or a dict of them (same type back)."""
        return self._reduce(value, mean=False)

    def all_reduce_mean(self, value: Any) -> Any:
        """Mean over ranks of a tensor, a Python number or a dict of them (same type back).

        >>> rt.all_reduce_mean({"loss": 0.5, "kl": 0.01})     # doctest: +SKIP
        {'loss': 0.47, 'kl': 0.012}
        """
        return self._reduce(value, mean=True)

    def _reduce(self, value: Any, mean: bool) -> Any:
        if isinstance(value, dict):
            if not value:
                return {}
            keys = sorted(value)  # same order on every rank, whatever the insertion order
            # One collective for the whole dict: pack scalars into one float64 vector.
            flat = torch.stack([torch.as_tensor(value[k], dtype=torch.float64).reshape(()).cpu() for k in keys])
            reduced = self._reduce(flat, mean)
            return {k: float(v) for k, v in zip(keys, reduced.tolist())}
        if isinstance(value, torch.Tensor):
            out = value.detach().clone()
            comm = out.to(self._comm_device()) if out.device != self._comm_device() else out
            if not comm.is_floating_point() and mean:
                comm = comm.double()
            dist.all_reduce(comm, op=dist.ReduceOp.SUM)
            if mean:
                comm = comm / self.world_size
            return comm.to(value.device) if comm.device != value.device else comm
        if isinstance(value, (int, float)):
            t = torch.tensor(float(value), dtype=torch.float64)
            out = float(self._reduce(t, mean))
            return int(out) if isinstance(value, int) and not mean else out
        raise TypeError(f"cannot all-reduce a {type(value).__name__}")

    def _comm_device(self) -> torch.device:
        # gloo reduces CPU tensors; NCCL reduces CUDA tensors.
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` (the same shape on all) concatenated along dim 0, in rank order."""
        if self.world_size == 1:
            return tensor.detach()
        comm = tensor.detach().to(self._comm_device()).contiguous()
        parts = [torch.empty_like(comm) for _ in range(self.world_size)]
        dist.all_gather(parts, comm)
        return torch.cat(parts).to(tensor.device)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s (picklable) object, returned on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=src, device=self._comm_device() if self.backend == "nccl" else None)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's object, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every rank arrives (bounded by ``dist_timeout``)."""
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def check_in_sync(self, module: nn.Module, what: str = "parameters") -> float:
        """Gather a checksum of ``module``'s parameters from every rank; raise if they differ.

        Returns the checksum. Used after wrapping (weights really were broadcast) and at every
        checkpoint (ranks never drifted apart).
        """
        checksum = parameter_checksum(unwrap(module))
        sums = self.all_gather_object(checksum)
        spread = max(sums) - min(sums)
        if spread > 1e-6 * (1.0 + abs(checksum)):
            raise RuntimeError(f"{what} differ across ranks: checksums {sums}")
        return checksum

    def close(self) -> None:
        """Leave the process group (safe to call twice)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def parameter_checksum(module: nn.Module) -> float:
    """A float that changes when any parameter changes (position-weighted sum in float64)."""
    total = 0.0
    for i, p in enumerate(module.parameters()):
        flat = p.detach().double().flatten()
        weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
        total += (i + 1) * float((flat * weights).sum())
    return total


def unwrap(module: nn.Module) -> nn.Module:
    """Strip DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers, any nesting."""
    while True:
        if isinstance(module, DDP):
            module = module.module
        elif hasattr(module, "_orig_mod") and isinstance(module._orig_mod, nn.Module):
            module = module._orig_mod
        else:
            return module


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


# ----------------------------------------------------------------------------------------
# Launch


def prepare_spawn(cfg: Any) -> Any:
    """Check the spawn-mode settings in the parent and fix ``master_port`` (auto → a free port).

    Done before any process starts, so bad input fails with one line and nothing half-made.
    Returns the settings the children receive.
    """
    if cfg.world_size < 1:
        raise UsageError(f"world_size={cfg.world_size} must be >= 1")
    if cfg.nnodes < 1 or cfg.world_size % cfg.nnodes:
        raise UsageError(f"world_size={cfg.world_size} must be a multiple of nnodes={cfg.nnodes}")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise UsageError(f"node_rank={cfg.node_rank} must be in [0, nnodes={cfg.nnodes})")
    local_world_size = cfg.world_size // cfg.nnodes
    # Validate the device/backend choice once, here, rather than in N children.
    choose_device_and_backend(cfg.device, cfg.backend, 0, local_world_size)
    if cfg.master_port == "auto":
        if cfg.nnodes > 1:
            raise UsageError("master_port=auto cannot be agreed between nodes; give master_port=<int> on every node")
        port = free_port()
    else:
        port = int(cfg.master_port)
        if cfg.node_rank == 0:
            check_port_free(cfg.master_addr if cfg.nnodes > 1 else "127.0.0.1", port)
    return port


def exit_process(code: int) -> None:
    """End this process with ``code``; without interpreter finalisation once DDP was used here.

    Why: in torch 2.13 a DDP wrapper keeps its gloo process group alive after
    ``destroy_process_group`` (constructing DDP leaves references to the group that are never
    released; without DDP the threads end), so the group's worker threads outlive ``close``.
    When one of them frees a finished collective's tensors it takes the GIL; if the
    interpreter is finalising at that moment the thread is unwound through C++ code and the
    process aborts ("terminate called without an active exception", SIGABRT) although all its
    work is done and written. Seen in ~5% of 2-rank runs here (gdb: ``pt_gloo_runloop`` in
    ``~AsyncAllgatherWork`` -> ``take_gil`` during ``Py_FinalizeEx``). A rank whose files are
    closed has nothing left for finalisation to do, so it runs the ``atexit`` handlers (W&B,
    multiprocessing's resource clean-up, logging), flushes and leaves with ``os._exit``.
    """
    if not _ddp_used:
        sys.exit(code)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _child(local_rank: int, fn: Callable, cfg: Any, dist_timeout: float) -> None:
    placement = placement_from_env(cfg, environ={}, local_rank=local_rank)
    try:
        _run_rank(placement, fn, cfg, dist_timeout)
    except SystemExit as e:  # bad input (exit 2) found inside this rank
        exit_process(e.code if isinstance(e.code, int) else 1)
    # Any other exception propagates: torch.multiprocessing sends its traceback to the parent.
    exit_process(0)


def _run_rank(placement: Placement, fn: Callable, cfg: Any, dist_timeout: float) -> Any:
    setup_logging(placement.rank)
    nccl_set = apply_nccl_preset(getattr(cfg, "nccl_preset", "none"))
    if nccl_set:
        log.info("nccl_preset=%s set %s", cfg.nccl_preset, " ".join(f"{k}={v}" for k, v in nccl_set.items()))
    # One intra-op thread per rank unless OMP_NUM_THREADS says otherwise: RL networks are small,
    # and OpenMP's thread hand-off on tiny tensors costs more than the op (seen here: tanh on
    # an 8x64 tensor took 5 us with 1 thread and 3.5 ms with 2), besides N ranks x all cores
    # oversubscribing the machine.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    rt = Runtime(placement, dist_timeout)
    try:
        return fn(rt, cfg)
    except UsageError as e:
        if rt.is_main:
            print(f"ddprl: error: {e}", file=sys.stderr, flush=True)
        else:  # bad input seen by this rank alone would otherwise go unsaid
            log.error("rank %d: %s", rt.rank, e)
        sys.exit(2)
    except BaseException as e:
        log.error("rank %d failed:\n%s", rt.rank, traceback.format_exc())
        if _is_peer_failure(e):
            # A collective broke because *another* rank died: leave the stage to that rank's
            # error for a moment, so the launcher reports the root cause, not the echo.
            time.sleep(3)
        raise
    finally:
        rt.close()


def _is_peer_failure(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted",
                            "Broken pipe", "timed out", "Timed out"))


def launch(fn: Callable[[Runtime, Any], Any], cfg: Any) -> Any:
    """Run ``fn(runtime, cfg)`` on every rank of the job (use functools.partial for more arguments).

    Under torchrun or srun this process *is* one rank. Otherwise ``cfg.world_size`` processes are
    spawned here (``world_size / nnodes`` per node). When one rank fails, the others are killed
    and ``launch`` raises ``RankFailed`` (``SystemExit(2)`` for bad input found inside a rank).
    A script of your own run under torchrun should end with ``exit_process(0)`` (see there).
    """
    launcher = detect_launcher()
    if launcher != "spawn":
        return _run_rank(placement_from_env(cfg), fn, cfg, cfg.dist_timeout)
    port = prepare_spawn(cfg)
    cfg = dataclasses.replace(cfg, master_port=str(port))
    nprocs = cfg.world_size // cfg.nnodes
    if nprocs == 1 and cfg.nnodes == 1:
        # One rank: run it in this process (same code path, a process group of one).
        return _run_rank(placement_from_env(cfg, environ={}, local_rank=0), fn, cfg, cfg.dist_timeout)
    try:
        mp.start_processes(_child, args=(fn, cfg, cfg.dist_timeout), nprocs=nprocs, join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        if e.exit_code == 2:
            raise SystemExit(2) from None
        raise RankFailed(f"rank {e.error_index} exited with code {e.exit_code}") from None
    except mp.ProcessRaisedException as e:
        last = [line for line in str(e).strip().splitlines() if line.strip()]
        raise RankFailed(f"rank {e.error_index} failed: {last[-1] if last else 'unknown error'}") from None
    return None


class RankFailed(RuntimeError):
    """A rank of a spawned job failed; the others were stopped."""
