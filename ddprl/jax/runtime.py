"""The JAX engine's runtime: processes, devices, the mesh, and the few host-side collectives.

One process per machine (the JAX way), each driving its local devices; the mesh spans every
process's devices along one axis, ``dev``. Environments are sharded along it, parameters are
replicated, gradients are averaged with ``lax.pmean`` over it.

Launch habits are the torch engine's: under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)
or srun (SLURM_PROCID/SLURM_NTASKS) this process is one of ``world_size`` JAX processes and
``jax.distributed.initialize`` connects them; otherwise ``world_size`` processes are spawned here
(``nnodes``/``node_rank`` spread them over machines). ``world_size=auto`` is one process per
node. On a CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` gives N simulated devices.

:class:`JaxRuntime` offers :class:`ddprl.run.Run` what the torch Runtime does (rank, is_main,
broadcast_object, all_gather_object, barrier, seeds), between processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from ddprl.errors import DISK_FULL_EXIT_CODE, DiskFull, UsageError, say_once
from ddprl.runtime import Seeds, detect_launcher, exit_process, failures, preemption, setup_logging, spawn
from ddprl.runtime.launch import restore_logging, spawn_port, spawn_sizes
from ddprl.runtime.placement import rendezvous_from_env

if TYPE_CHECKING:
    from ddprl.runtime.protocol import LaunchConfig

Config = TypeVar("Config", bound="LaunchConfig")
Result = TypeVar("Result")

log = logging.getLogger("ddprl")

AXIS = "dev"  # the mesh axis environments are sharded over and gradients averaged over
SIMULATE_HINT = "on a CPU, export XLA_FLAGS=--xla_force_host_platform_device_count=N for N simulated devices"


def require_jax() -> None:
    try:
        import jax  # noqa: F401
    except ImportError:
        raise UsageError("engine=jax needs JAX: pip install 'ddprl[jax]' (CPU; see docs/jax.md for CUDA)") from None


def process_identity(
    cfg: LaunchConfig, environ: dict[str, str] | os._Environ = os.environ, local_index: int | None = None
) -> tuple[int, int, str]:
    """``(process_id, num_processes, coordinator "host:port")`` of this JAX process."""
    r = rendezvous_from_env(cfg, environ, local_index if local_index is not None else 0)
    # torchrun's own rendezvous store listens on MASTER_PORT: JAX's coordinator takes the next one.
    port = r.master_port + 1 if r.launcher == "torchrun" else r.master_port
    return r.rank, r.world_size, f"{r.master_addr}:{port}"


def _platform(device: str) -> str | None:
    return {"auto": None, "cpu": "cpu", "cuda": "cuda"}[device]


def start_jax(cfg: LaunchConfig, process_id: int, num_processes: int, coordinator: str) -> None:
    """Pick the platform and connect the processes (before anything asks JAX for devices)."""
    import jax

    platform = _platform(cfg.device)
    if platform is not None:
        jax.config.update("jax_platforms", platform)
    if num_processes > 1:
        # JAX's preemption service (on by default where it exists) installs its own SIGTERM
        # handler at initialize, replacing ddprl's: the processes would train on past a SIGTERM.
        with contextlib.suppress(AttributeError, KeyError):
            jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=int(cfg.dist_timeout),
        )


def select_devices(devices: Any) -> list[Any]:
    """This process's devices for the mesh: all local ones (``auto``) or the first ``devices``."""
    import jax

    local = jax.local_devices()
    if devices == "auto":
        return local
    n = int(devices)
    if n > len(local):
        raise UsageError(
            f"devices={n} but this process sees {len(local)} {local[0].platform} device(s); "
            f"use devices={len(local)} or fewer ({SIMULATE_HINT})"
        )
    return local[:n]


class JaxRuntime:
    """This JAX process in the job: its place, the device mesh, host-side collectives."""

    def __init__(self, cfg: LaunchConfig):
        import jax
        from jax.experimental import multihost_utils
        from jax.sharding import Mesh

        self._mu = multihost_utils
        self.rank = jax.process_index()
        self.world_size = jax.process_count()
        self.is_main = self.rank == 0
        self.local_devices = select_devices(getattr(cfg, "devices", "auto"))
        counts = self.all_gather_object(len(self.local_devices))
        if len(set(counts)) > 1:
            raise UsageError(f"processes drive different numbers of devices ({counts}): give every process devices=N")
        chosen = {(d.process_index, d.id) for d in self.local_devices}
        chosen = set().union(*self.all_gather_object(chosen)) if self.world_size > 1 else chosen
        mesh_devices = [d for d in jax.devices() if (d.process_index, d.id) in chosen]
        self.mesh = Mesh(np.array(mesh_devices), (AXIS,))
        self.num_devices = len(mesh_devices)
        self.platform = mesh_devices[0].platform
        self.device = torch.device("cpu")  # where host-side torch tensors (checkpoints, eval) live
        self.hosts = self.all_gather_object(socket.gethostname())  # by rank
        self.first_on_host = self.hosts.index(self.hosts[self.rank]) == self.rank

    def seeds(self, seed: int) -> Seeds:
        return Seeds(seed, self.rank)

    # -- host-side collectives between processes (identity in a job of one process) -------------
    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = self._mu.process_allgather(np.array([data.size], np.int64)).reshape(-1)
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        gathered = np.asarray(self._mu.process_allgather(padded)).reshape(self.world_size, -1)
        return [pickle.loads(gathered[i, : int(sizes[i])].tobytes()) for i in range(self.world_size)]

    def all_reduce_mean(self, values: dict[str, float]) -> dict[str, float]:
        """The mean over processes of a dict of numbers (the same keys everywhere). One array of
        a fixed shape: JAX compiles the gather once, where pickled objects of varying sizes (as
        :meth:`all_gather_object` sends) would compile again at every new size."""
        if self.world_size == 1:
            return dict(values)
        keys = sorted(values)
        gathered = np.asarray(self._mu.process_allgather(np.array([values[k] for k in keys], np.float32)))
        return dict(zip(keys, gathered.reshape(self.world_size, -1).mean(0).tolist(), strict=True))

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj if self.world_size == 1 else self.all_gather_object(obj)[src]

    def barrier(self) -> None:
        if self.world_size > 1:
            self._mu.sync_global_devices("ddprl")

    def close(self) -> None:
        pass


def verify(rt: JaxRuntime) -> bool:
    """The cheap part of ``ddprl doctor``: a psum over every device of the mesh returns N(N+1)/2."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = rt.num_devices
    summed = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, AXIS), mesh=rt.mesh, in_specs=P(AXIS), out_specs=P()))
    values = jax.make_array_from_callback(
        (n,), NamedSharding(rt.mesh, P(AXIS)), lambda idx: np.arange(n, dtype=np.float32)[idx] + 1
    )
    out = summed(values)
    return all(float(jnp.asarray(s.data).reshape(-1)[0]) == n * (n + 1) / 2 for s in out.addressable_shards)


def doctor(rt: JaxRuntime, cfg: LaunchConfig, size_mb: float = 64.0) -> None:
    """``ddprl doctor engine=jax``: processes, devices, mesh, a psum check, pmean bandwidth."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    ok = verify(rt)
    n = rt.num_devices
    numel = max(1, int(size_mb * 2**20 / 4))
    mean = jax.jit(jax.shard_map(lambda x: jax.lax.pmean(x, AXIS), mesh=rt.mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
    buf = jax.device_put(np.ones((n, numel), np.float32), NamedSharding(rt.mesh, P(AXIS)))
    mean(buf).block_until_ready()  # compile + warm-up
    iters = 5
    t0 = time.perf_counter()
    for _ in range(iters):
        out = mean(buf)
    out.block_until_ready()
    seconds = max(rt.all_gather_object((time.perf_counter() - t0) / iters))
    all_ok = all(rt.all_gather_object(ok))
    if rt.is_main:
        algbw = numel * 4 / 1e9 / seconds
        busbw = algbw * 2 * (n - 1) / n if n > 1 else 0.0
        print(f"jax {jax.__version__}  platform: {rt.platform}  processes: {rt.world_size} (this one: {rt.rank})")
        print(
            f"local devices: {len(rt.local_devices)}  global devices: {len(jax.devices())}  "
            f"mesh: {dict(rt.mesh.shape)} over {', '.join(str(d) for d in rt.mesh.devices.flat)}"
        )
        print(f"psum correctness: {'OK' if all_ok else 'FAILED'} (expected {n * (n + 1) // 2} on every device)")
        print(
            f"pmean {numel * 4 / 2**20:.0f} MiB per device: {seconds * 1e3:.1f} ms, algbw {algbw:.2f} GB/s, "
            f"busbw {busbw:.2f} GB/s"
        )
        print("doctor: OK" if all_ok else "doctor: FAILED", flush=True)
    if not all_ok:
        raise RuntimeError("psum over the mesh returned wrong sums: the device set-up is broken")


# -- launch -------------------------------------------------------------------------------------
def launch(fn: Callable[[JaxRuntime, Config], Result], cfg: Config) -> Result | None:
    """Run ``fn(runtime, cfg)`` in every JAX process of the job (see the module docstring)."""
    require_jax()
    launcher = detect_launcher()
    if launcher != "spawn":
        return _run_process(fn, cfg, *process_identity(cfg))
    spawn_sizes(cfg)
    if cfg.world_size == 1:
        return _run_process(fn, cfg, 0, 1, "")
    cfg = dataclasses.replace(cfg, master_port=str(spawn_port(cfg)))
    nprocs = cfg.world_size // cfg.nnodes
    spawn(_child, (fn, cfg), nprocs, first_rank=cfg.node_rank * nprocs, several_hosts=cfg.nnodes > 1)
    return None


def _child(local_index: int, fn: Callable, cfg: LaunchConfig) -> None:
    try:
        _run_process(fn, cfg, *process_identity(cfg, environ={}, local_index=local_index))
    except SystemExit as e:
        exit_process(e.code if isinstance(e.code, int) else 1)
    exit_process(0)


def _run_process(
    fn: Callable[[JaxRuntime, Config], Result], cfg: Config, process_id: int, num_processes: int, coordinator: str
) -> Result:
    logging_before = setup_logging(process_id)
    previous_handlers = preemption.install_handlers()  # SIGTERM/SIGUSR1: stop at a step boundary, saved
    try:
        start_jax(cfg, process_id, num_processes, coordinator)
        rt = JaxRuntime(cfg)
        if not verify(rt):  # refuse a broken set-up before any run directory exists
            raise RuntimeError("psum over the device mesh returned wrong sums: run `ddprl doctor engine=jax`")
        result = fn(rt, cfg)
        rt.barrier()
        return result
    except UsageError as e:
        failures.record_failure(process_id, e)
        if process_id == 0:
            print(f"ddprl: error: {e}", file=sys.stderr, flush=True)
        else:
            log.error("process %d: %s", process_id, e)
        sys.exit(2)
    except preemption.Preempted:  # every process saved and left together (Run.preempted)
        sys.exit(preemption.PREEMPTED_EXIT_CODE)
    except DiskFull as e:  # every process learned it together (Run); process 0 says it
        say_once(f"ddprl: error: {e}", process_id == 0)
        sys.exit(DISK_FULL_EXIT_CODE)
    except BaseException as e:
        failures.record_failure(process_id, e)  # first, with the time: the launcher orders errors by it
        log.error("process %d failed:\n%s", process_id, traceback.format_exc())
        raise
    finally:
        preemption.restore_handlers(previous_handlers)
        restore_logging(logging_before)
