"""All-reduce through shared memory for CPU ranks on one machine.

Gloo moves a tensor between two processes of one machine through TCP and three threads a side;
on small tensors (a PPO gradient of 9k floats, a dict of metrics) its all-reduce costs a
millisecond or more, and an RL loop calls it every minibatch. Here each rank copies its tensor
into its own slot of one shared file, publishes a sequence number, waits until every rank has
published the same one, and sums the slots in rank order: every rank gets the same bits, as
with gloo, for the cost of two memory copies and a poll of a few counters
(docs/benchmarks.md, "Collectives"). Pickled objects up to a slot go the same way, one round
(gloo's object collectives make two: sizes, then data).

The wait polls, yields its core to any other runnable thread, and sleeps once a wait grows
long (a peer evaluating or saving), so an idle rank neither holds a core nor sleeps through the
moment its peers arrive. It is bounded by ``dist_timeout``, and names a peer whose process has
ended.

Ordering: a rank writes its slot, then its counter; a peer reads the counter, then the slots.
That order holds without fences on x86-64 (stores are seen in program order, loads happen in
program order), so :func:`supported` limits this to x86-64 Linux; elsewhere gloo is used.
"""

from __future__ import annotations

import mmap
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

CACHE_LINE = 64  # each rank's counter in a line of its own: no false sharing between writers
SLOT_BYTES = 1 << 20  # per rank and parity; larger tensors go through in chunks of this size
SPIN_S = 50e-6  # poll without yielding this long: a peer arriving now is seen within a microsecond
YIELD_S = 5e-3  # then poll and give the core away; after this (a peer evaluating?), poll every SLEEP_S
SLEEP_S = 200e-6
CHECK_PEERS_S = 0.5  # how often a long wait looks whether its peers' processes still exist


def supported() -> str | None:
    """Why shared-memory collectives cannot run here (None when they can)."""
    if sys.platform != "linux":
        return f"shared-memory collectives need Linux (this is {sys.platform})"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"shared-memory collectives need x86-64's store order (this is {platform.machine()})"
    if not os.path.isdir("/dev/shm"):
        return "/dev/shm does not exist"
    return None


def region_bytes(world_size: int) -> int:
    return world_size * CACHE_LINE + world_size * 2 * SLOT_BYTES


class PeerLost(RuntimeError):
    """A rank did not reach a shared-memory collective: its process ended, or the timeout passed."""


class SharedMemoryGroup:
    """The ranks of one machine reducing tensors through the file ``path`` (made by
    :func:`create_file`, opened by every rank; it may be unlinked once all have opened it).

    ``pids``: every rank's process id, in rank order, to tell a dead peer from a slow one.

    >>> group = SharedMemoryGroup(path, rank, world_size, timeout_s=1800, pids=pids)  # doctest: +SKIP
    >>> group.all_reduce_sum_(grad)            # grad now holds the sum over ranks, in place
    """

    def __init__(self, path: str, rank: int, world_size: int, timeout_s: float, pids: list[int]):
        self.rank, self.world_size, self.timeout_s, self.pids = rank, world_size, timeout_s, pids
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, region_bytes(world_size))
        finally:
            os.close(fd)
        header = world_size * CACHE_LINE
        # every rank's sequence number: one int64 at the start of each cache line
        self._counters = np.frombuffer(self._map, dtype=np.int64, count=header // 8)[:: CACHE_LINE // 8]
        data = torch.frombuffer(self._map, dtype=torch.uint8, offset=header, count=world_size * 2 * SLOT_BYTES)
        self._slots = data.view(world_size, 2, SLOT_BYTES)  # [rank, parity] -> bytes
        self._seq = int(self._counters[rank])  # 0 in a fresh file
        self.key = id(self)  # how an op in a compiled region finds this group (_OPEN)
        _OPEN[self.key] = self

    def all_reduce_sum_(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sum ``tensor`` (a CPU tensor) over ranks, in place or into ``out`` (contiguous, of its
        shape and dtype); every rank gets the same bits."""
        if not tensor.is_contiguous():
            return (tensor if out is None else out).copy_(self.all_reduce_sum_(tensor.contiguous()))
        flat = tensor.view(-1)
        flat_out = flat if out is None else out.view(-1)
        per_chunk = SLOT_BYTES // tensor.element_size()
        for start in range(0, flat.numel(), per_chunk):
            self._round(flat[start : start + per_chunk], flat_out[start : start + per_chunk])
        return tensor if out is None else out

    def barrier(self) -> None:
        """Return once every rank has called it."""
        empty = torch.empty(0)
        self._round(empty, empty)

    def all_gather_bytes(self, data: bytes) -> list[bytes] | None:
        """Every rank's ``data`` in rank order, in one round; None on every rank when some rank's is
        longer than a slot holds (each rank sees every length, so all of them decide alike)."""
        fits = len(data) <= SLOT_BYTES - 8

        def write(slot: torch.Tensor) -> None:
            mine = slot.numpy()
            mine[:8].view(np.int64)[0] = len(data)
            if fits:
                mine[8 : 8 + len(data)] = np.frombuffer(data, np.uint8)

        slots = self._slots.numpy()[:, self._exchange(write)]
        sizes = [int(slot[:8].view(np.int64)[0]) for slot in slots]
        if max(sizes) > SLOT_BYTES - 8:
            return None
        return [slot[8 : 8 + n].tobytes() for slot, n in zip(slots, sizes, strict=True)]

    def _round(self, chunk: torch.Tensor, out: torch.Tensor) -> None:
        """One round: ``chunk`` summed over ranks into ``out`` (``chunk`` itself or as large)."""
        n = chunk.numel() * chunk.element_size()

        def write(slot: torch.Tensor) -> None:
            if n:
                slot[:n].view(chunk.dtype).copy_(chunk)

        parity = self._exchange(write)
        if n:
            parts = [self._slots[r, parity, :n].view(chunk.dtype) for r in range(self.world_size)]
            # rank order on every rank: the same sum everywhere; the first two in one pass over memory
            if len(parts) == 1:
                out.copy_(parts[0])
            else:
                torch.add(parts[0], parts[1], out=out)
            for part in parts[2:]:
                out.add_(part)

    def _exchange(self, write: Callable[[torch.Tensor], None]) -> int:
        """One round: ``write`` this rank's slot (bytes), publish it, wait for every rank's; returns
        the parity of the slots to read."""
        self._seq += 1
        parity = self._seq & 1
        # Slot [rank, parity] was last read by the peers two rounds ago, and each of them has
        # published the round between since: nobody reads it any more.
        write(self._slots[self.rank, parity])
        self._counters[self.rank] = self._seq  # after the data: x86-64 keeps the two stores in order
        self._wait(self._seq)
        return parity

    def _wait(self, seq: int) -> None:
        counters = self._counters
        if counters.min() >= seq:
            return
        start = checked = time.perf_counter()
        while counters.min() < seq:
            now = time.perf_counter()
            waited = now - start
            if waited < SPIN_S:
                continue
            if waited < YIELD_S:
                os.sched_yield()
                continue
            time.sleep(SLEEP_S)
            if now - checked >= CHECK_PEERS_S:
                checked = now
                self._check_peers(seq, waited)

    def _check_peers(self, seq: int, waited: float) -> None:
        missing = [r for r in range(self.world_size) if self._counters[r] < seq]
        for r in missing:
            if not alive(self.pids[r]):
                raise PeerLost(
                    f"rank {r} (pid {self.pids[r]}) ended before a collective that rank {self.rank} waits in"
                )
        if waited > self.timeout_s:
            raise PeerLost(
                f"rank(s) {', '.join(map(str, missing))} did not reach a collective within dist_timeout="
                f"{self.timeout_s:g}s (rank {self.rank} waited {waited:.0f}s)"
            )

    def region_all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``tensor`` as a new tensor, callable inside a compiled region: one
        opaque op there (the compiler calls it, it does not trace it), where gloo's traceable
        all-reduce would move the tensor through TCP (1.69M floats, 2 ranks: 8-10 ms against 3)."""
        return torch.ops.ddprl.shm_all_reduce_sum(tensor, self.key)

    def close(self) -> None:
        _OPEN.pop(self.key, None)
        self._counters = None  # the views go before the map they point into
        self._slots = None
        try:
            self._map.close()
        except BufferError:  # a view still held somewhere: the map goes with the process
            pass


_OPEN: dict[int, SharedMemoryGroup] = {}  # the groups an op in a compiled region reaches, by id


# the schema given: this module's annotations are strings, which the oldest torch does not parse
@torch.library.custom_op("ddprl::shm_all_reduce_sum", mutates_args=(), schema="(Tensor tensor, int group) -> Tensor")
def _all_reduce_sum(tensor: torch.Tensor, group: int) -> torch.Tensor:
    return _OPEN[group].all_reduce_sum_(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format))


@_all_reduce_sum.register_fake
def _(tensor: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def create_file(world_size: int, directory: str = "/dev/shm") -> str:
    """A zero-filled file for a :class:`SharedMemoryGroup` of ``world_size`` ranks; its path.
    Raises OSError when ``directory`` lacks the room (a write past a full tmpfs would kill the
    process with SIGBUS, not fail)."""
    stat = os.statvfs(directory)
    if stat.f_bavail * stat.f_frsize < region_bytes(world_size):
        raise OSError(f"{directory} has less than the {region_bytes(world_size) >> 20} MiB the collectives need")
    path = os.path.join(directory, f"ddprl-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, region_bytes(world_size))
    finally:
        os.close(fd)
    return path


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (as this process sees them)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
