"""Which rank stopped answering, and on which host: a heartbeat per rank in the job's store.

When a collective fails because a peer is gone, the error names at most an address ("Connection
reset by peer [10.0.0.7]:41233") or nothing at all ("Timed out waiting 300000ms for recv"): a
rank that was SIGKILLed, stopped, or cut off by the network looks the same to its peers. So
each rank adds one to its own counter in the job's rendezvous store about once a second, from a
thread with a connection of its own; a rank whose collective failed reads every counter, waits a
few beats and reads them again (:meth:`Heartbeat.silent_ranks`): the ranks whose counter stood
still are the ones that stopped. The same thread notices when this process itself did not run
for a while (SIGSTOP, a suspended VM, a machine swapping): its one-second sleep took far longer
(:meth:`Heartbeat.frozen_s`).

Costs: one small store request per rank per second, nothing on the training path. A job of one
rank has no heartbeat.
"""

from __future__ import annotations

import datetime
import os
import threading
import time

import torch.distributed as dist

BEAT_S = 1.0  # seconds between two beats of a rank
ROLL_CALL_S = 3.5  # a rank whose counter did not move in this long stopped answering
FROZEN_S = 5.0  # a beat this much late: this process was not running
STORE_TIMEOUT_S = 5.0  # one store request that takes longer: the store is out of reach


class Heartbeat:
    """This rank's heartbeat, and the roll call of every rank's (see the module's docstring)."""

    def __init__(self, addr: str, port: int, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        # Keys apart per torchrun attempt: restarted workers must not read the dead attempt's beats.
        self._prefix = f"ddprl/beat/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self._addr, self._port = addr, port
        self._store: dist.Store | None = None
        self._lock = threading.Lock()  # one request at a time on the connection
        self._stop = threading.Event()
        self._last_tick = time.monotonic()
        self._frozen: tuple[float, float] | None = None  # (seconds not running, when it ended)
        self.store_lost = False  # the store answered once, then no more
        self._thread = threading.Thread(target=self._beat, name="ddprl-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            store = dist.TCPStore(
                self._addr,
                self._port,
                is_master=False,
                timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
            )
        except Exception:  # no store to beat in: silent_ranks() says it cannot tell
            return
        self._store = store
        key = f"{self._prefix}{self.rank}"
        while True:
            before = time.monotonic()
            if self._stop.wait(BEAT_S):
                return
            now = time.monotonic()
            late = now - before - BEAT_S  # the sleep alone: a slow store request is not a freeze
            if late > FROZEN_S:
                self._frozen = (late, now)
            self._last_tick = now
            try:
                with self._lock:
                    store.add(key, 1)
                self.store_lost = False
            except Exception:
                self.store_lost = True

    def frozen_s(self, within_s: float) -> float:
        """How long this process was not running, if it was in the last ``within_s`` seconds
        (0.0 if not): the longest of a late beat seen and the time since the last beat."""
        now = time.monotonic()
        late = now - self._last_tick - BEAT_S
        recorded = self._frozen[0] if self._frozen and now - self._frozen[1] <= within_s else 0.0
        longest = max(late, recorded)
        return longest if longest > FROZEN_S else 0.0

    def silent_ranks(self) -> list[int] | None:
        """The ranks whose heartbeat did not move in :data:`ROLL_CALL_S` (this one excepted), or
        None when the store cannot be read (never reached, or out of reach now)."""
        if self._store is None:
            return None
        try:
            before = self._counts()
            time.sleep(ROLL_CALL_S)
            after = self._counts()
        except Exception:
            self.store_lost = True
            return None
        return [r for r in range(self.world_size) if r != self.rank and after[r] == before[r]]

    def _counts(self) -> list[int]:
        assert self._store is not None
        with self._lock:
            return [self._store.add(f"{self._prefix}{r}", 0) for r in range(self.world_size)]

    def stop(self) -> None:
        """End the beats and wait for the thread (a request in flight ends within the store's
        timeout): a thread still inside the store's C++ code when the interpreter finalises
        would abort the process."""
        self._stop.set()
        self._thread.join(timeout=2 * STORE_TIMEOUT_S)
