"""Why a spawned job failed: each process writes a report of its error, the launcher picks the root cause.

When one rank raises, its peers usually fail soon after with errors of their own that only echo
its death: a collective whose connection closed, or that timed out waiting. The launcher should
name the first error, not an echo, and it must not guess from which process happened to exit
first (a rank can take long to exit after its error: closing its process group, atexit work).

So every spawned process has a report file in a directory the launcher made
(:func:`report_to`); a rank that fails writes its error there at once, before tearing anything
down (:func:`record_failure`), with the time it was caught. Once the processes have ended, the
launcher reads the reports and :func:`root_cause` picks the earliest error that is not an echo
(:func:`is_consequence`), or else the earliest echo. The times are ``time.monotonic()``, one
clock for all processes of a machine (CLOCK_MONOTONIC on Linux), and a spawning launcher only
compares processes of its own machine.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import socket
import tempfile
import time
import traceback

from ddprl.errors import UsageError

# Set in a spawned process by its launcher: where this process's report goes (None elsewhere:
# under torchrun, srun or in a world of one there is nobody to read it).
_report_path: str | None = None

# How a collective says a peer is gone (gloo, NCCL, the store): errors that follow another
# rank's failure rather than cause one.
PEER_FAILURE_TEXT = (
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL communicator was aborted",
    "Broken pipe",
    "timed out",
    "Timed out",
)


REPORTS_PREFIX = "ddprl-failures-"


def make_reports_dir() -> str:
    """A new directory for one job's reports, named after this host and launcher process.

    The launcher removes it when the job ends; a launcher killed with SIGKILL cannot, so each
    new one first removes those left by launchers of this host that no longer run.
    """
    sweep_reports_dirs()
    return tempfile.mkdtemp(prefix=f"{REPORTS_PREFIX}{_host()}-{os.getpid()}-")


def sweep_reports_dirs(tmp: str | None = None) -> None:
    """Remove report directories of this host whose launcher process has ended."""
    pattern = os.path.join(tmp or tempfile.gettempdir(), f"{REPORTS_PREFIX}{_host()}-*-*")
    for path in glob.glob(pattern):
        pid = os.path.basename(path)[len(REPORTS_PREFIX) + len(_host()) + 1 :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)  # another user's: not ours to remove, and we cannot


def _host() -> str:
    # A /tmp shared by several hosts must not lose a live job's reports to another host's sweep.
    return socket.gethostname().replace("-", "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclasses.dataclass(frozen=True)
class Failure:
    """One process's failure, as the launcher reads it."""

    index: int  # the process's index among those this launcher started
    rank: int | None  # its rank in the job, when it got as far as knowing it
    time: float  # time.monotonic() when the error was caught (or when the launcher saw the process end)
    summary: str  # one line: "ValueError: the message"
    consequence: bool = False  # an echo of another rank's failure (is_consequence)
    usage: bool = False  # bad input (UsageError): the job exits 2
    traceback: str = ""
    reported: bool = True  # False: the process ended with no report (a signal, os._exit); summary says how

    @property
    def name(self) -> str:
        return f"rank {self.index if self.rank is None else self.rank}"

    def message(self) -> str:
        """One line for the user: which rank, and its error (or how its process ended)."""
        return f"{self.name} failed: {self.summary}" if self.reported else f"{self.name} {self.summary}"


def report_to(path: str) -> None:
    """Have :func:`record_failure` write this process's report to ``path`` (called by the launcher's
    code in the new process, before anything else runs there)."""
    global _report_path
    _report_path = path


def is_consequence(e: BaseException) -> bool:
    """Whether ``e`` is a collective or connection failure that another rank's death explains."""
    return isinstance(e, RuntimeError) and any(s in str(e) for s in PEER_FAILURE_TEXT)


def summary(e: BaseException) -> str:
    """``Type: first line of the message`` (what a traceback's last line says, without C++ frames
    that some libraries append to the message)."""
    kind = type(e).__qualname__
    if type(e).__module__ not in ("builtins", "__main__"):
        kind = f"{type(e).__module__}.{kind}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{kind}: {lines[0]}" if lines else kind


def record_failure(rank: int | None, e: BaseException) -> None:
    """Write why this process failed for its launcher, if one is listening; call it where the error
    is caught, before closing anything (the time taken here orders the ranks' errors).

    Written whole or not at all (a temporary file renamed), and only once: the first error a
    process catches is its own, later ones come from tearing down after it.
    """
    caught = time.monotonic()
    path = _report_path
    if path is None or os.path.exists(path):
        return
    report = {
        "rank": rank,
        "time": caught,
        "summary": summary(e),
        "consequence": is_consequence(e),
        "usage": isinstance(e, UsageError),
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
    }
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)
    except OSError:  # the launcher is gone (its directory with it): nobody to tell
        pass


def read_report(path: str, index: int) -> Failure | None:
    """The report a process wrote to ``path``, or None if it wrote none."""
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    return Failure(
        index=index,
        rank=r["rank"],
        time=r["time"],
        summary=r["summary"],
        consequence=r["consequence"],
        usage=r["usage"],
        traceback=r["traceback"],
    )


def root_cause(failures: list[Failure]) -> Failure | None:
    """The earliest failure that is not an echo of another; if all are echoes, the earliest one.

    >>> a = Failure(index=0, rank=0, time=2.0, summary="RuntimeError: Connection closed by peer", consequence=True)
    >>> b = Failure(index=1, rank=1, time=5.0, summary="ValueError: bad")
    >>> root_cause([a, b]).name
    'rank 1'
    """
    return min(failures, key=lambda f: (f.consequence, f.time, f.index), default=None)
