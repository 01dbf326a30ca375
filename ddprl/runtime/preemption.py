"""Preemption: a signal to any rank (or to the launcher) ends the job at a step boundary, saved.

Clusters end jobs with a signal: SLURM sends SIGTERM at the time limit or on preemption (and
SIGUSR1 some seconds before, with ``sbatch --signal=USR1@SECONDS``); torchrun forwards the
SIGTERM it gets to its workers; ``ddprl train world_size=N`` forwards it to its processes.

In a rank, the handler only sets a flag: nothing is decided locally, since a rank that stopped
alone would leave its peers waiting in a collective. At step boundaries every rank calls
:meth:`StopCheck.__call__`, which every so often reduces the flags over the ranks (one small
collective); when any rank was signalled, all of them learn it at the same step, save one
collective checkpoint there and leave with :data:`PREEMPTED_EXIT_CODE`. A second signal only
sets the flag again: it cannot interrupt the save, which is atomic anyway.

The cadence: the reduction runs about once per ``interval_s`` of wall time, so its cost is a
small collective per second (measured in docs/benchmarks.md) whatever a step costs. The number
of steps between two reductions is derived from the *reduced* elapsed time, so every rank
computes the same one and the ranks stay in step with their collectives. That count is
measured on past steps, so a loop whose steps turn costlier at some point (TD-MPC2 when learning
starts after thousands of random steps of a millisecond each, QMIX when its warm-up ends) calls
:meth:`StopCheck.restart` there, at the same step on every rank: otherwise a window sized for
the cheap steps (thousands of them) would leave a signal waiting minutes for the next reduction.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from ddprl.runtime import failures

if TYPE_CHECKING:
    from ddprl.runtime.protocol import JobRuntime

log = logging.getLogger("ddprl")

# sysexits.h's EX_TEMPFAIL ("temporary failure; the user is invited to retry"): a checkpoint was
# saved at the signal, and the same command with resume=auto continues the job.
PREEMPTED_EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_received: list[int] = []  # signal numbers received by this process, in order


class Preempted(Exception):
    """Raised on every rank after the preemption checkpoint: the job ends with exit code 75."""


def _on_signal(signum: int, frame: Any) -> None:
    # Only record it: logging or saving from a signal handler could re-enter a lock held by the
    # interrupted code.
    note(signum)


def note(signum: int) -> None:
    """Record a stop signal this process received (its handlers, or a launcher passing it on)."""
    _received.append(signum)


def install_handlers() -> dict[int, Any]:
    """Catch SIGTERM and SIGUSR1 in this process (main thread only) and remember them; returns
    the handlers they replace, for :func:`restore_handlers`."""
    _received.clear()
    return {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS}


def restore_handlers(previous: dict[int, Any]) -> None:
    """Put the replaced handlers back, unless a stop signal came: then this process is on its way
    out with exit code 75, and a repeated signal must not kill it half-way (it stays recorded)."""
    if _received:
        return
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def received() -> str | None:
    """The name of the first stop signal this process received, or None."""
    return signal.Signals(_received[0]).name if _received else None


class StopCheck:
    """Collective: whether any rank has received a stop signal (every rank calls it at every step
    boundary; most calls return at once, without a collective).

    ``rt``: a runtime with ``all_reduce_sum`` of a dict (the torch one: one small all-reduce), or
    else ``all_gather_object`` (the JAX one).
    """

    def __init__(self, rt: JobRuntime, interval_s: float = 1.0, max_every: int = 100_000):
        self.rt, self.interval_s, self.max_every = rt, interval_s, max_every
        self.every = 1  # step boundaries between two reductions; the first one reduces at once
        self.calls = 0
        self.last = time.perf_counter()
        self.reductions = 0
        self.reduce_s = 0.0  # time spent in the reductions (their cost)
        self.signal: str | None = None  # which signal stopped the job, and where, once known

    def restart(self) -> None:
        """The cost of a step changes from here (every rank calls it at the same step boundary):
        the next call reduces, and the cadence is measured afresh on the new steps."""
        self.every, self.calls, self.last = 1, 0, time.perf_counter()

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls < self.every:
            return False
        start = time.perf_counter()
        signalled, elapsed = self._reduce(start - self.last)
        self.reduce_s += time.perf_counter() - start
        self.reductions += 1
        # Grows at most 4x per reduction: one quick first step must not stretch the next wait.
        target = int(self.calls * self.interval_s / max(elapsed, 1e-9))
        self.every = max(1, min(self.max_every, 4 * self.calls, target))
        self.calls = 0
        self.last = time.perf_counter()
        if signalled:
            self.signal = signalled
            return True
        return False

    def _reduce(self, elapsed: float) -> tuple[str | None, float]:
        """(which signal on which ranks, or None; the elapsed time averaged over ranks: the same
        number on every rank, hence the same cadence). Who got a signal is gathered only once
        one did: a second collective, at the stop alone."""
        name = received()
        hosts = getattr(self.rt, "hosts", None)
        if hasattr(self.rt, "all_reduce_sum"):
            total = self.rt.all_reduce_sum({"ranks": float(name is not None), "elapsed": elapsed})
            mean_elapsed = total["elapsed"] / self.rt.world_size
            if total["ranks"] == 0:
                return None, mean_elapsed
            return signalled_ranks(self.rt.all_gather_object(name), hosts), mean_elapsed
        flags = self.rt.all_gather_object((name, elapsed))
        names = [n for n, _ in flags]
        line = signalled_ranks(names, hosts) if any(names) else None
        return line, sum(e for _, e in flags) / len(flags)


def signalled_ranks(names: list[str | None], hosts: list[str] | None = None) -> str:
    """Which signal reached which ranks, from each rank's first one (None: none): ``SIGTERM on
    rank 1``, ``SIGTERM on all 8 ranks``, ``SIGTERM on ranks 2, 3 on gpu02`` (hosts named when
    the job spans several).

    >>> signalled_ranks([None, "SIGTERM"])
    'SIGTERM on rank 1'
    >>> signalled_ranks(["SIGUSR1", "SIGTERM", None, None], ["a", "a", "b", "b"])
    'SIGUSR1 on rank 0 on a, SIGTERM on rank 1 on a'
    """
    by_signal: dict[str, list[int]] = {}
    for rank, name in enumerate(names):
        if name is not None:
            by_signal.setdefault(name, []).append(rank)
    named = failures.hosts_if_several(hosts) if hosts is not None else None

    def where(ranks: list[int]) -> str:
        return f"all {len(ranks)} ranks" if len(ranks) == len(names) > 1 else failures.ranks_on_hosts(ranks, named)

    return ", ".join(f"{name} on {where(ranks)}" for name, ranks in by_signal.items())
