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
import re
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
    rank: int | None  # its rank in the job (None: the launcher could not tell; index stands in)
    time: float  # time.monotonic() when the error was caught (or when the launcher saw the process end)
    summary: str  # one line: "ValueError: the message"; of an echo, who stopped answering (lost_peers)
    consequence: bool = False  # an echo of another rank's failure (is_consequence)
    usage: bool = False  # bad input (UsageError): the job exits 2
    traceback: str = ""
    reported: bool = True  # False: the process ended with no report (a signal, os._exit); summary says how
    host: str | None = None  # the machine it ran on, in a job on several
    named: bool = False  # an echo whose summary names the ranks that stopped answering
    whole_line: bool = False  # the summary is a whole line that names the rank (lost_peers)

    @property
    def name(self) -> str:
        rank = f"rank {self.index if self.rank is None else self.rank}"
        return rank if self.host is None else f"{rank} on {self.host}"

    def message(self) -> str:
        """One line for the user: which rank (and host), and its error or how its process ended;
        for an echo, the ranks that stopped answering as that rank saw it."""
        if not self.reported:
            return f"{self.name} {self.summary}"
        return self.summary if self.whole_line else f"{self.name} failed: {self.summary}"


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


def peer_error(e: BaseException) -> str:
    """A collective's error without what gloo adds around it (its source position, its advice):
    ``Read error [10.0.0.7]:41233: Connection reset by peer``."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\] ", "", text)
    return re.split(r"\.? This is typically caused by", text)[0].rstrip(". ")


def hosts_if_several(hosts: list[str]) -> list[str] | None:
    """Every rank's host (``hosts``) when the job spans several machines, else None: messages
    name hosts only then."""
    return hosts if len(set(hosts)) > 1 else None


def ranks_on_hosts(ranks: list[int], hosts: list[str] | None) -> str:
    """``rank 1 on gpu01 and ranks 2, 3 on gpu02``: ranks grouped by the host they ran on
    (``hosts``: every rank's; None in a job on one machine: ``ranks 1, 2``)."""
    by_host: dict[str | None, list[int]] = {}
    for r in sorted(ranks):
        by_host.setdefault(None if hosts is None else hosts[r] if r < len(hosts) else "an unknown host", []).append(r)
    return " and ".join(
        f"{'ranks' if len(rs) > 1 else 'rank'} {', '.join(map(str, rs))}" + (f" on {host}" if host else "")
        for host, rs in by_host.items()
    )


def lost_peers(
    rank: int, hosts: list[str] | None, error: str, silent: list[int] | None, store_lost: bool, frozen_s: float
) -> str:
    """One line on a collective that failed because a peer is gone, from rank ``rank``'s view
    (``hosts``: every rank's, None in a job on one machine): this rank itself was not running
    (``frozen_s``), or these ranks fell ``silent``, or rank 0's host is out of reach
    (``store_lost``), or no peer is known to have stopped. Rank 0 serves the job's store: a rank
    of its own host that lost it saw rank 0 end (stopped by their launcher), which says nothing
    about the peer at fault."""
    me = ranks_on_hosts([rank], hosts)
    if frozen_s:
        return (
            f"{me} was not running for {frozen_s:.0f} s (stopped, or its machine froze), "
            f"and its peers went on without it: {error}"
        )
    if silent:
        return f"{ranks_on_hosts(silent, hosts)} stopped answering ({me}: {error})"
    if silent is None and store_lost and hosts is not None and hosts[0] != hosts[rank]:
        return f"{me} lost contact with {hosts[0]}, the host of rank 0 ({error})"
    return f"{me} failed: {error}"


def record_failure(
    rank: int | None,
    e: BaseException,
    host: str | None = None,
    caught: float | None = None,
    lost: str | None = None,
    named: bool = False,
) -> None:
    """Write why this process failed for its launcher, if one is listening; call it where the error
    is caught, before closing anything (``caught``, that time, orders the ranks' errors). ``lost``:
    an echo's line (:func:`lost_peers`); ``named``: it names the ranks that stopped answering.

    Written whole or not at all (a temporary file renamed), and only once: the first error a
    process catches is its own, later ones come from tearing down after it.
    """
    caught = time.monotonic() if caught is None else caught
    path = _report_path
    if path is None or os.path.exists(path):
        return
    report = {
        "rank": rank,
        "time": caught,
        "summary": lost or summary(e),
        "consequence": is_consequence(e),
        "usage": isinstance(e, UsageError),
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
        "host": host,
        "named": named,
        "whole_line": lost is not None,
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
        host=r["host"],
        named=r["named"],
        whole_line=r["whole_line"],
    )


def root_cause(failures: list[Failure]) -> Failure | None:
    """The earliest failure that is not an echo of another; if all are echoes, the earliest of
    those that name the ranks that stopped answering, else the earliest one.

    >>> a = Failure(index=0, rank=0, time=2.0, summary="RuntimeError: Connection closed by peer", consequence=True)
    >>> b = Failure(index=1, rank=1, time=5.0, summary="ValueError: bad")
    >>> root_cause([a, b]).name
    'rank 1'
    """
    return min(failures, key=lambda f: (f.consequence, not f.named, f.time, f.index), default=None)
