"""What the benchmark scripts share: the machine, the load other processes put on it, a subprocess (``ddprl train``)
and its metrics, alternated repeats, markdown tables. ``python benchmarks/X.py`` puts this folder on sys.path."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
QUIET = ("progress=false", "checkpoint_freq=0", "eval_freq=0", "eval_episodes=0")  # a timed run does nothing else


def jax_cpu(devices: int = 1) -> dict[str, str]:
    """The environment of a JAX run on the CPU, split into ``devices`` host devices."""
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}


def git_head(tree) -> str:
    """The commit checked out in ``tree`` ("" where it is no git checkout)."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def cpu_model() -> str:
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return platform.processor() or platform.machine()


def machine() -> str:
    import torch

    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu_model()}, {os.cpu_count()} cores{gpu}; Python {platform.python_version()}, torch {torch.__version__}"


def versions(python: str, packages: tuple[str, ...]) -> str:
    """The versions of ``packages`` that ``python`` (another environment's) has."""
    code = "import importlib.metadata as m, sys\nfor p in sys.argv[1:]:\n try: print(p, m.version(p))\n except: 0"
    try:
        out = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return ", ".join(out.splitlines())


def busy_seconds(cpu: str = "cpu") -> float:
    """Busy CPU-seconds so far of the machine (``cpu``) or of one core (``cpu3``); nan without /proc/stat."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(s for s in Path("/proc/stat").read_text().splitlines() if s.split(" ", 1)[0] == cpu)
        f = [int(v) for v in line.split()[1:]]
        return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK")  # user nice system irq softirq
    return float("nan")


def cpu_counters() -> tuple[float, float, float, float]:
    """Busy CPU-seconds of the machine (nan without /proc/stat), of this process, of its waited-for children; time."""
    t = os.times()
    return busy_seconds(), t.user + t.system, t.children_user + t.children_system, time.perf_counter()


def rate(points: list[tuple[int, float]], warmup: int = 1) -> float:
    """Steps/s from the end of iteration ``warmup`` (>= 1) to the end of the last, ``points`` being (steps, time)
    at the end of each iteration."""
    kept = points[warmup - 1 :]
    if len(kept) < 2:
        raise RuntimeError(f"{len(points)} iterations, too few to leave {warmup} out")
    return (kept[-1][0] - kept[0][0]) / (kept[-1][1] - kept[0][1])


def sps_points(lines: list[tuple[float, str]], iteration: int) -> list[tuple[int, float]]:
    """A CleanRL script's ``SPS: N`` lines as (steps at the end of that iteration, the time the line was read)."""
    times = [t for t, text in lines if text.startswith("SPS: ")]
    return [((i + 1) * iteration, t) for i, t in enumerate(times)]


def last_sps(lines: list[tuple[float, str]]) -> float:
    """A CleanRL script's own figure: its last ``SPS: N`` (steps over the time since its start)."""
    return float(next(text.split()[1] for _, text in reversed(lines) if text.startswith("SPS: ")))


def foreign_load(before: tuple, after: tuple, tree_cpu: float | None = None) -> float:
    """Cores used by processes outside this one and its children between two samples (``tree_cpu``: the children's
    CPU-seconds when known better than by the waited-for ones)."""
    children = max(after[2] - before[2], tree_cpu or 0.0)
    return ((after[0] - before[0]) - (after[1] - before[1]) - children) / (after[3] - before[3])


def column(rows: list[dict], key: str) -> list:
    return [r[key] for r in rows if key in r]


def run(cmd, *, env=None, cwd=REPO, timeout=None, metrics: Path | None = None, stop: Callable | None = None) -> dict:
    """``cmd`` in a session of its own (``env``: variables added), each output line kept with the monotonic time it
    was read; with ``stop``, SIGTERM to it once ``stop(rows of metrics)`` holds. Returns lines, rows, wall s, s to
    the stop (None), other processes' load; a failure or ``timeout`` raises RuntimeError with the output's tail."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "disable"), "PYTHONUNBUFFERED": "1", **(env or {})}
    before, start, lines, stop_s = cpu_counters(), time.perf_counter(), [], None

    def rows() -> list[dict]:  # the complete lines of ``metrics`` so far
        text = metrics.read_text() if metrics and metrics.exists() else ""
        return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]

    pipe = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, **pipe)
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), s.rstrip("\n")) for s in proc.stdout))
    reader.start()
    try:
        while proc.poll() is None:
            if timeout and time.perf_counter() - start > timeout:
                raise RuntimeError(f"{cmd[-1]}: timed out after {timeout:.0f} s")
            if stop and stop_s is None and stop(rows()):
                stop_s = time.perf_counter() - start
                os.killpg(proc.pid, signal.SIGTERM)
            time.sleep(0.05)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL) if proc.poll() is None else ():
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, sig)
                proc.wait(30)
        reader.join()
    wall = time.perf_counter() - start
    if proc.returncode != 0 and stop_s is None:
        tail = "\n".join(s for _, s in lines[-15:])
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{tail}")
    return dict(lines=lines, rows=rows(), wall=wall, stop_s=stop_s, other=foreign_load(before, cpu_counters()))


def train(keys: str | list[str], prefix=(), **kw) -> dict:
    """``ddprl train KEYS`` (a list, or one string of them) in a temporary run directory through :func:`run`, its
    metrics rows read."""
    keys = keys.split() if isinstance(keys, str) else keys
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*prefix, sys.executable, "-m", "ddprl", "train", *keys, f"run_dir={tmp}/run"]
        return run(cmd, metrics=Path(tmp, "run", "metrics.jsonl"), **kw)


def alternate(plan: dict[str, Callable[[int], dict]], repeats: int, rotate=True, max_other=None, retries=0) -> dict:
    """``plan[name](repeat)`` for every name, ``repeats`` rounds, the order rotated each round; a run during which
    other processes used more than ``max_other`` cores is redone ``retries`` times (the least loaded kept). A run
    that raised is kept as ``{"error": ...}``."""
    out: dict[str, list[dict]] = {name: [] for name in plan}
    for r in range(repeats):
        shift = r % len(plan) if rotate else 0
        for name in list(plan)[shift:] + list(plan)[:shift]:
            kept = None
            for _ in range(retries + 1):
                try:
                    result = plan[name](r)
                except Exception as e:  # reported, the other runs go on
                    result = {"error": f"{type(e).__name__}: {e}"}
                if say := result.get("error") or result.pop("say", ""):
                    print(f"[{name}, round {r + 1}] {say}", file=sys.stderr)
                if kept is None or "error" in kept or result.get("other", 0) < kept.get("other", 0):
                    kept = result
                if "error" in result or max_other is None or result.get("other", 0) <= max_other:
                    break
            out[name].append(kept)
    return out


def middle(results: list[dict], key: str) -> dict:
    """The run of median ``key`` (the lower middle one of an even count), failed runs left out."""
    ok = sorted((r for r in results if "error" not in r), key=lambda r: r[key])
    return ok[(len(ok) - 1) // 2] if ok else results[0]


def median(values) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def table(head: list[str], rows: list[list] = ()) -> None:
    for cells in (head, ["---"] * len(head), *rows):
        row(cells)


def row(cells: list) -> None:
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def calls_per_s(fn: Callable, device="cpu", calls: int | None = None, seconds=0.0, warmup=0) -> float:
    """Calls of ``fn`` a second after ``warmup`` untimed ones: ``calls`` of them, else as many as ``seconds`` allow
    (then the GPU waited for after each; at the end either way)."""
    import torch

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else lambda: None
    for _ in range(warmup):
        fn()
    sync()
    n, start = 0, time.perf_counter()
    while n < calls if calls is not None else time.perf_counter() - start < seconds:
        fn()
        n += 1
        if calls is None:
            sync()
    sync()
    return n / (time.perf_counter() - start)


def parser(doc: str, repeats=0, contention: tuple[float, int] | None = None) -> argparse.ArgumentParser:
    """The flags of a script: ``--repeats`` (its default); ``contention``: :func:`alternate`'s ``--max-other`` and
    ``--retries`` (their defaults)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if repeats:
        p.add_argument("--repeats", type=int, default=repeats, help="runs of each row, alternated (medians kept)")
    if contention:
        p.add_argument("--max-other", type=float, default=contention[0], help="redo a run while others used more cores")
        p.add_argument("--retries", type=int, default=contention[1], help="redos of a run (the least contended kept)")
    return p
