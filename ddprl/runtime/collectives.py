"""``Runtime``: rank, world and device of this process, and the collective verbs algorithms use.

Every collective has the timeout ``dist_timeout`` given at start (docs/distributed.md,
invariant 9), and ``world_size=1`` goes through the same code (a process group of one).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pickle
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddprl.runtime import failures, shm
from ddprl.runtime.compat import compiled_inner, ddp_buffer_kwargs, functional_all_gather, functional_all_reduce
from ddprl.runtime.liveness import Heartbeat
from ddprl.runtime.placement import Placement
from ddprl.runtime.seeding import Seeds

log = logging.getLogger("ddprl")

# Set once this process joined a process group, and once DDP has wrapped a module in it; see
# ``launch.exit_process`` and ``Runtime.close``.
_group_joined = False
_ddp_used = False


class Runtime:
    """Rank, world and device of this process, and the collective verbs algorithms may use.

    Every collective has the timeout ``dist_timeout`` given at start (docs/distributed.md,
    invariant 9), and ``world_size=1`` goes through the same code (a process group of one).
    """

    def __init__(self, placement: Placement, dist_timeout: float, host_collectives: str = "auto"):
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
        store = elastic_attempt_store(dist_timeout) if placement.launcher == "torchrun" else None
        if store is not None:
            dist.init_process_group(
                backend=self.backend, store=store, rank=self.rank, world_size=self.world_size, timeout=self.timeout
            )
        else:
            # Under torchrun, env:// reuses the store its agent already serves on MASTER_PORT.
            init_method = (
                "env://"
                if placement.launcher == "torchrun"
                else f"tcp://{_url_host(placement.master_addr)}:{placement.master_port}"
            )
            dist.init_process_group(
                backend=self.backend,
                init_method=init_method,
                rank=self.rank,
                world_size=self.world_size,
                timeout=self.timeout,
            )
        global _group_joined
        _group_joined = True
        self.collective_s = 0.0  # seconds this rank spent in collectives, waiting for peers included
        self._host: shm.SharedMemoryGroup | None = None  # shared-memory collectives, once the ranks chose them
        self.host = socket.gethostname()
        self.hosts = self.all_gather_object(self.host) if self.world_size > 1 else [self.host]  # by rank
        self.hosts_if_several = failures.hosts_if_several(self.hosts)
        self.first_on_host = self.hosts.index(self.host) == self.rank  # says what every host should hear
        self.heartbeat = (
            Heartbeat(placement.master_addr, placement.master_port, self.rank, self.world_size)
            if self.world_size > 1
            else None
        )
        if host_collectives != "gloo" and self.world_size > 1 and self.backend == "gloo":
            self._host = self._join_host_group(required=host_collectives == "shm")

    @property
    def named_host(self) -> str | None:
        """This rank's host when the job spans several machines (messages name it then), else None."""
        return self.host if self.hosts_if_several else None

    @property
    def collectives(self) -> str:
        """What carries this rank's collectives: ``shared memory``, ``gloo`` or ``nccl``."""
        return "shared memory" if self._host is not None else self.backend

    def _join_host_group(self, required: bool) -> shm.SharedMemoryGroup | None:
        """Shared-memory collectives (``ddprl.runtime.shm``) when every rank runs on this machine,
        else None (gloo's). Decided together: every rank uses the same ones."""
        reason = shm.supported()
        path = None
        if self.is_main and reason is None:
            try:
                path = shm.create_file(self.world_size)
            except OSError as e:
                reason = str(e)
        path = self.broadcast_object(path)
        group, why_not = None, reason
        if path is not None and self.hosts_if_several:
            why_not = "the ranks run on more than one machine"
        elif path is not None:
            try:
                group = shm.SharedMemoryGroup(path, self.rank, self.world_size, self.timeout.total_seconds(), [])
            except OSError as e:  # the file is on another machine's /dev/shm
                why_not = f"rank {self.rank} cannot open {path}: {e}"
        pids = self.all_gather_object(os.getpid())
        if group is not None and not all(shm.alive(pid) for pid in pids):  # another PID namespace
            why_not = f"rank {self.rank} cannot see its peers' processes"
        # Decided on every rank's view, gathered: a rank alone choosing gloo would deadlock the others.
        views = self.all_gather_object((group is not None and why_not is None, why_not))
        if self.is_main and path is not None:
            os.unlink(path)  # every rank has it mapped (or failed to): nothing is left behind
        if all(ok for ok, _ in views):
            group.pids = pids
            if self.is_main:
                log.info("collectives: shared memory between the %d ranks of this machine", self.world_size)
            return group
        if group is not None:
            group.close()
        why_not = next((w for ok, w in views if not ok and w), None) or why_not
        (log.warning if required else log.info)("collectives: gloo (%s)", why_not)
        return None

    # -- modules ---------------------------------------------------------------------------

    def wrap(self, module: nn.Module, compile: bool = False, find_unused_parameters: bool = False) -> nn.Module:
        """Move ``module`` to this rank's device and wrap it in DDP (then ``torch.compile``).

        DDP broadcasts rank 0's parameters and buffers at construction, so every rank starts
        from the same weights; derive targets/EMA copies *after* this call (invariant 2).
        Buffers are broadcast then too, but not on every forward: running statistics are
        reduced explicitly by the algorithm, never silently overwritten (the DDP keywords
        for that differ between torch versions: ``compat.ddp_buffer_kwargs``).

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
            buffer_kwargs, broadcast_yourself = ddp_buffer_kwargs()
            module = DDP(
                module,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=find_unused_parameters,
                **buffer_kwargs,
            )
            if broadcast_yourself:  # older torch: broadcast_buffers=False skipped them at construction
                self.broadcast_buffers(module.module)
            if self._host is not None:  # each gradient bucket through shared memory, not gloo
                module.register_comm_hook(None, self._bucket_mean_hook)
        if compile:
            module = torch.compile(module)
        return module

    def _bucket_mean_hook(self, state, bucket):  # unannotated: DDP checks the annotations it finds
        """DDP's communication hook on shared memory: the bucket's mean over ranks, done when
        returned (DDP hands buckets over in the same order on every rank)."""
        grads = bucket.buffer()
        self._all_reduce_sum_(grads)
        grads.div_(self.world_size)
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(grads)
        return done

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
        inner = compiled_inner(module) or module
        if enabled and isinstance(inner, DDP):
            return inner.no_sync()
        return contextlib.nullcontext()

    def broadcast_buffers(self, module: nn.Module, src: int = 0) -> None:
        """Overwrite every buffer of ``module`` with rank ``src``'s (in place)."""
        self._broadcast_(list(module.buffers()), src)

    def _broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        """Overwrite ``tensors`` with rank ``src``'s, in place, through the backend's device."""
        with torch.no_grad():
            for tensor in tensors:
                comm = tensor.detach().to(self._comm_device())  # shares the storage when already there
                dist.broadcast(comm, src=src)
                if comm.data_ptr() != tensor.data_ptr():
                    tensor.copy_(comm)

    def seeds(self, seed: int) -> Seeds:
        """This rank's seeds for every purpose (``ddprl.runtime.seeding``)."""
        return Seeds(seed, self.rank)

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
            return {k: float(v) for k, v in zip(keys, reduced.tolist(), strict=True)}
        if isinstance(value, torch.Tensor):
            out = value.detach().clone()
            comm = out.to(self._comm_device()) if out.device != self._comm_device() else out
            if not comm.is_floating_point() and mean:
                comm = comm.double()
            self._all_reduce_sum_(comm)
            if mean:
                comm = comm / self.world_size
            return comm.to(value.device) if comm.device != value.device else comm
        if isinstance(value, (int, float)):
            t = torch.tensor(float(value), dtype=torch.float64)
            out = float(self._reduce(t, mean))
            return int(out) if isinstance(value, int) and not mean else out
        raise TypeError(f"cannot all-reduce a {type(value).__name__}")

    def _all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` (contiguous, on the backend's device) over ranks in place, timed."""
        start = time.perf_counter()
        if self.world_size == 1:
            pass
        elif self._host is not None:
            self._host.all_reduce_sum_(tensor)
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.collective_s += time.perf_counter() - start

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

    # -- collectives a compiled region may hold (traceable: functional collectives) -----------

    def region_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean over ranks of ``tensor`` (a flat gradient: ONE all-reduce, what DDP does with its
        buckets), traceable so that it can sit inside a compiled region (``ddprl.algos.graphs``).
        A world of one: ``tensor`` itself.

        >>> flat_grad = rt.region_mean(flat_grad)     # doctest: +SKIP
        """
        if self.world_size == 1:
            return tensor
        if torch.compiler.is_compiling() and self._host is not None:
            total = self._host.region_all_reduce_sum(tensor.float())
        elif torch.compiler.is_compiling():  # public since torch 2.3 (the floor is 2.4)
            total = functional_all_reduce(tensor.float(), "sum", self._group())
        else:
            # Run eagerly (compile=false, or a region fallen back): the in-place collective. The
            # functional one costs more per call outside a graph (gloo, 9k floats, 2 ranks
            # interleaved: 1.8 ms against 1.0 ms median), and PPO calls this every minibatch.
            total = tensor.to(torch.float32, copy=True)
            self._all_reduce_sum_(total)
        return (total / self.world_size).to(tensor.dtype)

    def region_all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along dim 0 in rank order, traceable (see
        :meth:`region_mean`). A world of one: ``tensor`` itself."""
        if self.world_size == 1:
            return tensor
        return functional_all_gather(tensor.contiguous(), 0, self._group())

    def broadcast_module(self, module: nn.Module, src: int = 0) -> None:
        """Overwrite ``module``'s parameters and buffers with rank ``src``'s (what DDP does at
        construction), for modules a compiled region updates without a DDP wrapper."""
        if self.world_size > 1:
            self._broadcast_(list(module.parameters()) + list(module.buffers()), src)

    @staticmethod
    def _group() -> Any:
        return dist.group.WORLD

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s (picklable) object, returned on every rank."""
        if self._host is not None:  # one shared-memory round instead of two gloo broadcasts
            every = self._host.all_gather_bytes(pickle.dumps(obj) if self.rank == src else b"")
            if every is not None:
                return pickle.loads(every[src])
        box = [obj]
        dist.broadcast_object_list(box, src=src, device=self._comm_device() if self.backend == "nccl" else None)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's object, in rank order, on every rank."""
        if self._host is not None:  # one shared-memory round instead of two gloo all-gathers (sizes, data)
            every = self._host.all_gather_bytes(pickle.dumps(obj))
            if every is not None:
                return [pickle.loads(data) for data in every]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every rank arrives (bounded by ``dist_timeout``)."""
        if self._host is not None:
            self._host.barrier()
        elif self.backend == "nccl":
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

    def lost_peers(self, e: BaseException) -> tuple[str, bool] | None:
        """For a collective that failed because a peer is gone (``failures.is_consequence``): one
        line naming the ranks that stopped answering, and whether it names any. Takes a roll call
        of the heartbeats (a few seconds; ``ddprl.runtime.liveness``). None in a world of one."""
        if self.heartbeat is None:
            return None
        frozen = self.heartbeat.frozen_s(within_s=self.timeout.total_seconds() + 60.0)
        silent = None if frozen else self.heartbeat.silent_ranks()
        line = failures.lost_peers(
            self.rank, self.hosts_if_several, failures.peer_error(e), silent, self.heartbeat.store_lost, frozen
        )
        return line, bool(silent)

    def close(self) -> None:
        """Leave the process group (safe to call twice).

        Once DDP was used here the group is left to the process's exit: torch keeps a DDP
        model's gloo group alive anyway (see ``launch.exit_process``, which ends such a process
        with ``os._exit``), and on torch 2.4 ``destroy_process_group`` sometimes never returned
        after a DDP job (seen in ~1 of 8 two-rank runs of the KL test).
        """
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._host is not None:
            self._host.close()
            self._host = None
        if dist.is_initialized() and not _ddp_used:
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
    """Strip DDP (``.module``) and ``torch.compile`` wrappers, any nesting."""
    while True:
        if isinstance(module, DDP):
            module = module.module
        elif compiled_inner(module) is not None:
            module = compiled_inner(module)
        else:
            return module


def elastic_attempt_store(dist_timeout: float) -> Any:
    """Under torchrun with restarts: the agent's store, keyed apart for this attempt (else None).

    torchrun's c10d rendezvous shares one store with its workers for the whole job, and a
    process group writes the same keys in every attempt: workers restarted after a failure
    read the dead attempt's addresses (gloo: "connectFullMesh failed ... Connection refused";
    NCCL: a stale unique id; pytorch/pytorch#135712). Keys under the attempt number keep
    attempts apart. The number is each agent's own restart count: on several nodes the agents
    of healthy nodes do not count a restart, so there export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    to torchrun instead (a fresh store each attempt; docs/distributed.md, "Clusters").
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) == 0:
        return None
    if env.get("RANK") == "0" and env.get("WORLD_SIZE") != env.get("LOCAL_WORLD_SIZE"):
        log.warning(
            "torchrun restarts on several nodes: export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 to torchrun "
            "on every node, or a restart of one node's workers may hang in the rendezvous"
        )
    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=dist_timeout)
    )
    return dist.PrefixStore(f"ddprl/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
