"""Where a rank's wall time goes: environment stepping, acting, learning, collectives, evaluation,
checkpoints, the rest.

A loop marks its phases (``with split.phase("env"): ...``); the time a phase spends inside
collectives (the runtime's ``collective_s`` clock, waiting for peers included) is charged to
``collective``, not to the phase, and a phase nested in another is charged to itself alone. What
no phase covers is ``other`` (logging, bookkeeping). :class:`ddprl.run.Run` owns one per job,
logs each window's split as ``time/<phase>_s`` (mean over ranks) and names the largest share
in the end-of-run summary.

>>> split = TimeSplit(lambda: 0.0)
>>> with split.phase("env"):
...     pass
>>> sorted(split.take())[:3]
['act', 'checkpoint', 'collective']
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

# "sync": the host waiting for a device (the JAX engine's compiled iteration); "data": a
# supervised loader's batches.
PHASES = ("env", "act", "learn", "data", "collective", "sync", "eval", "checkpoint", "other")


class TimeSplit:
    """Seconds per phase since the last :meth:`take`; ``collective_clock()``: seconds spent in
    collectives so far (monotone)."""

    def __init__(self, collective_clock: Callable[[], float]):
        self._clock = collective_clock
        self._window = dict.fromkeys(PHASES, 0.0)
        self._window_start = time.perf_counter()
        self._window_clock = collective_clock()
        self._open: list[list[float]] = []  # per open phase: [nested seconds, nested collective seconds]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the block's time to ``name`` (its collectives and nested phases excepted)."""
        if name not in PHASES or name in ("collective", "other"):
            raise ValueError(f"not a phase a loop marks: {name!r}")
        start, clock_start = time.perf_counter(), self._clock()
        nested = [0.0, 0.0]
        self._open.append(nested)
        try:
            yield
        finally:
            self._open.pop()
            seconds, collective = time.perf_counter() - start, self._clock() - clock_start
            self._window[name] += (seconds - nested[0]) - (collective - nested[1])
            if self._open:  # the enclosing phase does not count this block again
                self._open[-1][0] += seconds
                self._open[-1][1] += collective

    def move(self, seconds: float, source: str, target: str) -> None:
        """Recharge ``seconds`` of ``source`` to ``target`` (a part timed finer inside a phase,
        such as the env steps inside a rollout)."""
        self._window[source] -= seconds
        self._window[target] += seconds

    def take(self) -> dict[str, float]:
        """This rank's seconds per phase since the last call (every phase, zeros included); the
        window's collectives all count, inside phases or not, and ``other`` is what is left."""
        now, clock = time.perf_counter(), self._clock()
        window = dict(self._window)
        window["collective"] = clock - self._window_clock
        window["other"] = max(0.0, (now - self._window_start) - sum(v for k, v in window.items() if k != "other"))
        self._window = dict.fromkeys(PHASES, 0.0)
        self._window_start, self._window_clock = now, clock
        return window


def shares(totals: dict[str, float], at_least: float = 0.01) -> str:
    """``learn 52 %, env 30 %, collective 9 %, ...``: phases of at least ``at_least``, largest first."""
    whole = sum(totals.values())
    if whole <= 0:
        return ""
    ranked = sorted(((v / whole, k) for k, v in totals.items() if v / whole >= at_least), reverse=True)
    return ", ".join(f"{k} {100 * f:.0f} %" for f, k in ranked)
