"""What every benchmark script reports about where it ran: the CPU, the load other processes
put on it while a run ran, and the printed report (to stdout and optionally a file).

Imported by the scripts beside it (``python benchmarks/<script>.py`` puts this folder first on
``sys.path``).
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuSample(NamedTuple):
    busy: float  # busy CPU-seconds of the whole machine (nan without /proc/stat)
    own: float  # CPU-seconds of this process
    children: float  # CPU-seconds of its waited-for children
    wall: float


def cpu_counters() -> CpuSample:
    """A sample to difference over a run (see :func:`foreign_load`)."""
    busy = float("nan")
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf(
            "SC_CLK_TCK"
        )  # user nice system irq softirq
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return CpuSample(busy, t.user + t.system, t.children_user + t.children_system, time.perf_counter())


def foreign_load(before: CpuSample, after: CpuSample, tree_cpu: float | None = None) -> float:
    """Cores used by processes outside this one and its children between two samples
    (``tree_cpu``: the children's CPU-seconds when known better than by the waited-for ones)."""
    children = after.children - before.children
    if tree_cpu is not None:
        children = max(children, tree_cpu)
    return ((after.busy - before.busy) - (after.own - before.own) - children) / (after.wall - before.wall)


def emit_report(print_report: Callable[[], None], path: str | None) -> None:
    """Run ``print_report`` once: its output goes to stdout and, with ``path``, to that file."""
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        print_report()
    print(report.getvalue(), end="")
    if path:
        Path(path).write_text(report.getvalue())
