"""Soak: every algorithm trained for half an hour at 2 ranks; memory, files and threads must stay flat.

    python benchmarks/soak.py                                   # 30 minutes of each, one after the other
    python benchmarks/soak.py --minutes 2 --only ppo,jax --parallel --out /tmp/soak

Each workload is a real ``ddprl train`` (spawn mode, world_size=2, device=cpu, progress off)
with a budget it never reaches, a step checkpoint every 10-30 s and an evaluation every few
seconds to a minute (on a 2-core machine; keep_last=3), stopped after ``--minutes`` by SIGTERM
to the launcher, which saves and exits 75. The JAX engine's 2 is world_size=2: two JAX
processes of one CPU device each, as in benchmarks/scaling.py. QMIX's replay (500 episodes)
fills within the first minute; TD-MPC2's (1,000 transitions per rank, ~130 kB) is too small to
matter.

Every 5 s the script reads from /proc every process of each job's tree: the launcher,
multiprocessing's resource tracker, the two ranks (the launcher's other Python children, rank 0
the first started, as the launcher starts them) and whatever those start (workers): resident
memory (VmRSS), open file descriptors, threads and CPU time. Every second it lists the run's
checkpoints/ directory.

Checks, per process present in both windows: the median of 30 s after its first minute (of CPU
for a rank: past its warm-up even on a machine shared by five jobs) against the median of the
last 30 s before the SIGTERM, RSS at most 5 % above (a leak grows; memory handed back is no
leak), file descriptors and threads not above (and, not checked, the slope of RSS after that). Per job: never
more step_<N>.pt files than keep_last (one more in the instant between a save and its
pruning), at the end the newest keep_last of all seen, latest.pt the newest, best.pt present;
exit code 75 and no process of the job left once the launcher has ended (any left is killed,
as is everything on every path out of this script).

Writes to ``--out`` (a new or empty directory): one run directory and one log per workload,
samples.json (every sample) and report.md (the tables printed). Exits 1 when a check fails.
``--report DIR`` prints (and rewrites) DIR's report from its samples.json, running nothing.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from machine import cpu_counters, cpu_model, emit_report, foreign_load

from ddprl.checkpoint import STEP_FILE
from ddprl.metrics import metrics_path, read_metrics

SAMPLE_S = 5.0  # between two samples of the processes
LIST_S = 1.0  # between two listings of checkpoints/
BASELINE_S = (
    60.0  # "after the first minute" of the job: where the reference window of a process that works little starts
)
BASELINE_CPU_S = (
    60.0  # ... and of a rank: once it has used a minute of CPU (its warm-up is over, however loaded the machine)
)
WINDOW_S = 30.0  # the reference and the end values are medians over this long
STOP_GRACE_S = 300.0  # SIGTERM to exit: an evaluation in flight and a save, on a loaded machine
GONE_S = 5.0  # after the launcher's exit, for its children to end before they count as left behind
RSS_TOLERANCE = 0.05
KEEP_LAST = 3
BUDGET = 10**9  # steps (epochs for supervised) no soak reaches
COMMON = ["world_size=2", "device=cpu", "progress=false", f"keep_last={KEEP_LAST}"]


@dataclass(frozen=True)
class Workload:
    name: str
    keys: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


WORKLOADS = [
    Workload(
        "ppo",
        ("algo=ppo", "task=CartPole-v1", f"steps={BUDGET}", "checkpoint_freq=100000", "eval_freq=100000"),
    ),
    Workload(
        "qmix",
        (
            "algo=qmix",
            "task=Foraging-8x8-2p-2f-coop-v3",
            f"steps={BUDGET}",
            "buffer_size=500",
            "checkpoint_freq=30000",
            "eval_freq=15000",
            "eval_episodes=20",
        ),
    ),
    Workload(
        "tdmpc2",
        (
            "algo=tdmpc2",
            "task=walker-run",
            "model_size=1",
            "episode_length=50",
            "seed_steps=100",
            "buffer_size=1000",
            f"steps={BUDGET}",
            "checkpoint_freq=25",
            "eval_freq=150",
            "eval_episodes=2",
            "log_freq=20",
        ),
    ),
    Workload(
        "supervised",
        ("algo=supervised", "task=digits", f"epochs={BUDGET}", "patience=0", "checkpoint_freq=300", "eval_freq=5"),
    ),
    Workload(
        "jax",
        (
            "engine=jax",
            "task=gymnax/CartPole-v1",
            "num_envs=32",
            f"steps={BUDGET}",
            "checkpoint_freq=40960",
            "eval_freq=24576",
        ),
        (("XLA_FLAGS", "--xla_force_host_platform_device_count=1"), ("JAX_PLATFORMS", "cpu")),
    ),
]


@dataclass
class Job:
    workload: Workload
    out: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0  # monotonic time of the launch
    stopped_at: float | None = None  # seconds from the launch to the SIGTERM (None: ended by itself)
    stop_s: float | None = None  # from the SIGTERM to the launcher's exit (None: it did not exit)
    exit_code: int | None = None
    roles: dict[int, str] = field(default_factory=dict)
    starttimes: dict[int, int] = field(default_factory=dict)  # every pid seen, with its start time
    samples: list[dict[str, Any]] = field(default_factory=list)  # {"t": s since the launch, "procs": {pid: values}}
    listings: list[dict[str, Any]] = field(default_factory=list)  # {"t", "steps": step files on disk}, on change
    left_behind: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.out / self.workload.name

    @property
    def log(self) -> Path:
        return self.out / f"{self.workload.name}.log"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ddprl", "train", *self.workload.keys, *COMMON, f"run_dir={self.run_dir}"]

    def clock(self) -> float:
        return time.monotonic() - self.started

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# -- /proc -------------------------------------------------------------------------------------
class Proc(NamedTuple):
    ppid: int
    start: int  # clock ticks after boot: with the pid, the identity of a process
    pgid: int


def process_table() -> dict[int, Proc]:
    """Every live process of the machine, from /proc/<pid>/stat (zombies left out)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := read_stat(int(name))) is not None:
            table[int(name)] = proc
    return table


def read_stat(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # ended in between
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
    if fields[0] in ("Z", "X"):
        return None
    return Proc(int(fields[1]), int(fields[19]), int(fields[2]))


def descendants(root: int, table: dict[int, Proc]) -> list[int]:
    """``root`` and every live process below it, parents first, siblings in the order they started."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    tree, todo = [], [root] if root in table else []
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo += sorted(children.get(pid, []), key=lambda p: (table[p].start, p))
    return tree


def role_of(pid: int, ppid: int, job: Job) -> str:
    """launcher; tracker (multiprocessing's resource tracker); rank <r>: the launcher's other Python
    children, numbered in the order they started (the order the launcher starts its ranks);
    launcher child <k> (anything else it runs); <the parent's role> worker <k> below them."""
    if pid == job.proc.pid:
        return "launcher"
    if ppid == job.proc.pid:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            argv = []
        if any("resource_tracker" in a for a in argv):
            return "tracker"
        stem = "rank" if argv and Path(argv[0]).name.startswith("python") else "launcher child"
    else:
        stem = f"{job.roles.get(ppid, f'pid {ppid}')} worker"
    return f"{stem} {sum(r.rsplit(' ', 1)[0] == stem for r in job.roles.values())}"


def read_process(pid: int) -> dict[str, float] | None:
    """VmRSS (kB), open file descriptors, threads and CPU seconds of ``pid``; None when it has ended."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    status = dict(line.split(":", 1) for line in lines if ":" in line)
    ticks = stat[stat.rindex(")") + 2 :].split()[11:13]  # utime, stime
    return {
        "rss_kb": int(status["VmRSS"].split()[0]),
        "fds": fds,
        "threads": int(status["Threads"]),
        "cpu_s": round(sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK"), 2),
    }


def sample(job: Job, table: dict[int, Proc]) -> None:
    """One sample of every process of the job's tree."""
    procs = {}
    for pid in descendants(job.proc.pid, table):
        if job.starttimes.get(pid) != table[pid].start:  # new (or a reused pid: another process)
            job.starttimes[pid] = table[pid].start
            job.roles[pid] = role_of(pid, table[pid].ppid, job)
        if (values := read_process(pid)) is not None:
            procs[str(pid)] = values
    job.samples.append({"t": round(job.clock(), 1), "procs": procs})


def list_checkpoints(job: Job) -> None:
    """Note the step_<N>.pt files of checkpoints/ when they differ from the last listing."""
    folder = job.run_dir / "checkpoints"
    try:
        steps = sorted(int(m.group(1)) for name in os.listdir(folder) if (m := STEP_FILE.fullmatch(name)))
    except OSError:  # not made yet
        return
    if not job.listings or job.listings[-1]["steps"] != steps:
        job.listings.append({"t": round(job.clock(), 1), "steps": steps})


# -- running and stopping ----------------------------------------------------------------------
def start(job: Job) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **dict(job.workload.env))
    env.setdefault("MUJOCO_GL", "disable")
    with open(job.log, "w") as log:
        job.proc = subprocess.Popen(
            job.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    job.started = time.monotonic()
    print(f"{job.workload.name}: started, pid {job.proc.pid}, log {job.log}", file=sys.stderr)


def still_running(job: Job) -> list[int]:
    """The job's processes that have not ended: every one seen in its tree that is still the same
    process, and every one of its process group (start_new_session: the group is the launcher's pid)."""
    table = process_table()
    seen = [pid for pid, start in job.starttimes.items() if pid in table and table[pid].start == start]
    group = [pid for pid, proc in table.items() if job.proc is not None and proc.pgid == job.proc.pid]
    return sorted(set(seen + group))


def kill_tree(job: Job) -> list[str]:
    """SIGKILL whatever of the job still runs; returns those processes (role and pid)."""
    left = still_running(job)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if job.proc is not None and job.proc.poll() is None:
        job.proc.wait()
    return [f"{job.roles.get(pid, 'unsampled')} (pid {pid})" for pid in left]


def stop(jobs: list[Job]) -> None:
    """SIGTERM to every running launcher, a bounded wait for them, GONE_S for their processes to end,
    then SIGKILL to anything left (noted in ``left_behind``)."""
    sent = time.monotonic()
    for job in jobs:
        if job.running():
            job.stopped_at = job.clock()
            job.proc.send_signal(signal.SIGTERM)
        else:
            print(f"{job.workload.name}: ended by itself with {job.proc.returncode}, see its log", file=sys.stderr)
    stopping = [job for job in jobs if job.stopped_at is not None]
    while stopping and time.monotonic() - sent < STOP_GRACE_S:
        for job in stopping:
            if not job.running():
                job.stop_s = time.monotonic() - sent
        stopping = [job for job in stopping if job.stop_s is None]
        time.sleep(0.1)
    end = time.monotonic() + GONE_S
    while time.monotonic() < end and any(still_running(job) for job in jobs if not job.running()):
        time.sleep(0.1)
    for job in jobs:
        job.left_behind = kill_tree(job)
        job.exit_code = job.proc.returncode
        list_checkpoints(job)
        left = ", ".join(job.left_behind) or "nothing"
        print(f"{job.workload.name}: exit code {job.exit_code}, left running: {left}", file=sys.stderr)


def soak(jobs: list[Job], seconds: float) -> None:
    """Run ``jobs`` side by side for ``seconds``, sampling them, then stop them; on every way out
    (an error, Ctrl-C, a signal to this script) no process of theirs is left."""
    try:
        for job in jobs:
            start(job)
        next_sample = time.monotonic()
        end = next_sample + seconds
        while time.monotonic() < end and any(job.running() for job in jobs):
            for job in jobs:
                list_checkpoints(job)
            if time.monotonic() >= next_sample:
                table = process_table()
                for job in jobs:
                    if job.running():
                        sample(job, table)
                next_sample += SAMPLE_S
            time.sleep(LIST_S)
        stop(jobs)
    finally:
        for job in jobs:
            kill_tree(job)


# -- results -----------------------------------------------------------------------------------
def median_in(job: Job, pid: str, name: str, window: tuple[float, float]) -> float | None:
    """The median of ``name`` of process ``pid`` over the samples of ``window`` (s from the launch)."""
    got = [s["procs"][pid][name] for s in job.samples if window[0] <= s["t"] <= window[1] and pid in s["procs"]]
    return statistics.median(got) if got else None


def windows(job: Job) -> tuple[tuple[float, float], tuple[float, float]]:
    """The job's first-minute window and its end window (the last samples), in s from the launch."""
    last = job.samples[-1]["t"] if job.samples else 0.0
    return (BASELINE_S, BASELINE_S + WINDOW_S), (last - WINDOW_S, last)


def reference_window(job: Job, pid: str) -> tuple[float, float]:
    """Where process ``pid``'s reference values are read: from the sample at which it had used
    BASELINE_CPU_S of CPU (a rank past its warm-up: compiling, filling its buffers, whether it
    had the cores to itself or shared them with four other jobs), else the job's first minute."""
    busy = next((s["t"] for s in job.samples if pid in s["procs"] and s["procs"][pid]["cpu_s"] >= BASELINE_CPU_S), None)
    return windows(job)[0] if busy is None else (busy, busy + WINDOW_S)


def process_results(job: Job) -> list[dict[str, Any]]:
    """Per process: RSS, fds and threads at its reference and at the end (medians), RSS's max and
    trend, the checks (None for a process absent from either window): RSS at most 5 % above its
    reference (a leak grows; memory handed back is no leak), fds and threads not above."""
    _, end = windows(job)
    out = []
    for pid in sorted(job.roles, key=lambda p: (job.starttimes[p], p)):
        seen = [s["procs"][str(pid)] for s in job.samples if str(pid) in s["procs"]]
        if not seen:
            continue
        base = reference_window(job, str(pid))
        row: dict[str, Any] = {
            "role": job.roles[pid],
            "pid": pid,
            "reference_at_s": base[0],
            "rss_max_kb": max(v["rss_kb"] for v in seen),
        }
        later = [s for s in job.samples if s["t"] >= base[0] and str(pid) in s["procs"]]
        if len(later) >= 2:  # a least-squares line through RSS after the reference: a leak's slope
            rss = [s["procs"][str(pid)]["rss_kb"] for s in later]
            row["rss_trend_kb_per_10min"] = statistics.linear_regression([s["t"] for s in later], rss).slope * 600
        for name in ("rss_kb", "fds", "threads"):
            row[name] = [median_in(job, str(pid), name, base), median_in(job, str(pid), name, end)]
        (rss0, rss1), (fds0, fds1), (th0, th1) = row["rss_kb"], row["fds"], row["threads"]
        row["checks"] = None
        if None not in (rss0, rss1):
            row["rss_change"] = rss1 / rss0 - 1
            row["checks"] = {"rss": rss1 / rss0 - 1 <= RSS_TOLERANCE, "fds": fds1 <= fds0, "threads": th1 <= th0}
        out.append(row)
    return out


def keep_last_problem(job: Job, written: list[int], kept: list[int]) -> str | None:
    """What breaks keep_last (None: nothing): too many step files at some listing, not the newest
    kept at the end, latest.pt not the newest, no best.pt; or too few written to tell."""
    folder = job.run_dir / "checkpoints"
    most = max((len(listing["steps"]) for listing in job.listings), default=0)
    if len(written) <= KEEP_LAST:
        return f"only {len(written)} written: pruning untested"
    if most > KEEP_LAST + 1:
        return f"{most} step files at once"
    if kept != written[-KEEP_LAST:]:
        return f"kept {kept}, the newest written are {written[-KEEP_LAST:]}"
    latest = folder / "latest.pt"
    if not latest.is_file() or not filecmp.cmp(latest, folder / f"step_{kept[-1]}.pt", shallow=False):
        return f"latest.pt is not step_{kept[-1]}.pt"
    if not (folder / "best.pt").is_file():
        return "no best.pt"
    return None


def job_results(job: Job) -> dict[str, Any]:
    rows = read_metrics(job.run_dir) if metrics_path(job.run_dir).is_file() else []
    written = sorted(set().union(*(listing["steps"] for listing in job.listings)))
    kept = job.listings[-1]["steps"] if job.listings else []
    base, end = windows(job)
    counts = [[len(s["procs"]) for s in job.samples if window[0] <= s["t"] <= window[1]] for window in (base, end)]
    return {
        "step": max((r["step"] for r in rows), default=None),
        "evaluations": sum(any(k.startswith(("eval/", "val/")) for k in r) for r in rows),
        "checkpoints_written": written,
        "checkpoints_kept": kept,
        "keep_last_problem": keep_last_problem(job, written, kept),
        "processes": [statistics.median(c) if c else None for c in counts],
        "clean_exit": job.exit_code == 75 and not job.left_behind,
    }


def cpu_seconds(job: Job) -> float:
    """CPU seconds of the job's processes, as last sampled."""
    last: dict[str, float] = {}
    for s in job.samples:
        last.update({pid: v["cpu_s"] for pid, v in s["procs"].items()})
    return sum(last.values())


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "**FAIL**"


def pair(values: list[float | None], scale: float = 1.0) -> str:
    return " → ".join("n/a" if v is None else f"{v / scale:.{1 if scale > 1 else 0}f}" for v in values)


def print_tables(jobs: list[Job], results: dict[str, dict[str, Any]], header: str) -> None:
    print(header)
    print()
    print(
        "| workload | exit | SIGTERM to exit s | step reached | evaluations | checkpoints written (seen) | kept "
        f"| keep_last={KEEP_LAST} | processes 1 min → end | left running (killed here) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---|")
    for job in jobs:
        r = results[job.workload.name]
        problem = r["keep_last_problem"]
        stop_s = "n/a" if job.stop_s is None else f"{job.stop_s:.1f}"
        print(
            f"| {job.workload.name} | {job.exit_code} {verdict(r['clean_exit'])} | {stop_s} | {r['step']} "
            f"| {r['evaluations']} | {len(r['checkpoints_written'])} | {', '.join(map(str, r['checkpoints_kept']))} "
            f"| {verdict(problem is None)}{f' ({problem})' if problem else ''} | {pair(r['processes'])} "
            f"| {', '.join(job.left_behind) or 'none'} |"
        )
    print()
    print(
        "| workload | process (pid) | reference at s | RSS reference MB | RSS end MB | RSS max MB | RSS change "
        "| RSS trend MB / 10 min | fds reference → end | threads reference → end | RSS ≤ +5 % | fds flat "
        "| threads flat |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    for job in jobs:
        for p in results[job.workload.name]["processes_detail"]:
            checks = p["checks"] or {}
            change = f"{100 * p['rss_change']:+.1f} %" if "rss_change" in p else "n/a"
            trend = f"{p['rss_trend_kb_per_10min'] / 1024:+.1f}" if "rss_trend_kb_per_10min" in p else "n/a"
            rss0, rss1 = (pair([v], 1024) for v in p["rss_kb"])
            print(
                f"| {job.workload.name} | {p['role']} ({p['pid']}) | {p['reference_at_s']:.0f} | {rss0} | {rss1} "
                f"| {p['rss_max_kb'] / 1024:.1f} "
                f"| {change} | {trend} | {pair(p['fds'])} | {pair(p['threads'])} | {verdict(checks.get('rss'))} "
                f"| {verdict(checks.get('fds'))} | {verdict(checks.get('threads'))} |"
            )
    print()
    print(
        f"Reference: the median of the {WINDOW_S:.0f} s of samples from the one at which the process had used "
        f"{BASELINE_CPU_S:.0f} s of CPU (a process that never did: from {BASELINE_S:.0f} s after the launch); "
        f"end: the median of the last {WINDOW_S:.0f} s before the SIGTERM (a sample every {SAMPLE_S:.0f} s). "
        "RSS trend: the slope of a least-squares line through the samples from the reference on. "
        "Checkpoints written: the step files seen in listings every second (at least those)."
    )


def failed(r: dict[str, Any]) -> bool:
    checks = [c for p in r["processes_detail"] if p["checks"] for c in p["checks"].values()]
    return not (r["clean_exit"] and r["keep_last_problem"] is None and checks and all(checks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training time of each workload")
    names = ",".join(w.name for w in WORKLOADS)
    parser.add_argument("--only", default=names, help=f"comma-separated workload names: {names}")
    parser.add_argument("--parallel", action="store_true", help="run the workloads side by side, not one by one")
    parser.add_argument("--out", default=f"runs/soak-{time.strftime('%Y%m%d-%H%M%S')}", help="a new or empty folder")
    parser.add_argument("--report", type=Path, help="a soak's folder: its report again, from its samples.json")
    args = parser.parse_args()
    if args.report is not None:
        sys.exit(report_again(args.report))
    chosen = [w for w in WORKLOADS if w.name in args.only.split(",")]
    if not chosen or len(chosen) != len(set(args.only.split(","))):
        raise SystemExit(f"--only {args.only}: choose among {names}")
    if args.minutes * 60 < BASELINE_S + 2 * WINDOW_S:
        raise SystemExit(f"--minutes {args.minutes}: at least {(BASELINE_S + 2 * WINDOW_S) / 60:g}")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"--out {out}: not empty")
    out.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # end through soak's finally: no job left running
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))

    jobs = [Job(w, out) for w in chosen]
    before = cpu_counters()
    for group in [jobs] if args.parallel else [[job] for job in jobs]:
        soak(group, args.minutes * 60)
    load = foreign_load(before, cpu_counters(), sum(map(cpu_seconds, jobs)))

    results = {job.workload.name: {**job_results(job), "processes_detail": process_results(job)} for job in jobs}
    how = "side by side" if args.parallel else "one after the other"
    header = (
        f"Machine: {cpu_model()}, {os.cpu_count()} logical cores; {time.strftime('%Y-%m-%d')}; "
        f"{args.minutes:g} min of each workload, {how}; other load on the machine meanwhile: {load:.2f} cores"
    )
    record = {
        "header": header,
        "minutes": args.minutes,
        "parallel": args.parallel,
        "keep_last": KEEP_LAST,
        "jobs": {
            job.workload.name: {
                "command": job.command(),
                "env": dict(job.workload.env),
                "exit_code": job.exit_code,
                "sigterm_at_s": job.stopped_at,
                "sigterm_to_exit_s": job.stop_s,
                "left_behind": job.left_behind,
                "roles": {str(pid): role for pid, role in job.roles.items()},
                "samples": job.samples,
                "checkpoint_listings": job.listings,
                "results": results[job.workload.name],
            }
            for job in jobs
        },
    }
    (out / "samples.json").write_text(json.dumps(record, indent=1))
    emit_report(lambda: print_tables(jobs, results, header), str(out / "report.md"))
    sys.exit(1 if any(failed(r) for r in results.values()) else 0)


def report_again(out: Path) -> int:
    """The checks and tables of a finished soak, from ``out/samples.json``; 1 when a check fails."""
    record = json.loads((out / "samples.json").read_text())
    by_name = {w.name: w for w in WORKLOADS}
    jobs = []
    for name, saved in record["jobs"].items():
        job = Job(by_name[name], out, exit_code=saved["exit_code"], left_behind=saved["left_behind"])
        job.stopped_at, job.stop_s = saved["sigterm_at_s"], saved["sigterm_to_exit_s"]
        job.samples, job.listings = saved["samples"], saved["checkpoint_listings"]
        job.roles = {int(pid): role for pid, role in saved["roles"].items()}
        first_seen = {pid: next(i for i, s in enumerate(job.samples) if str(pid) in s["procs"]) for pid in job.roles}
        job.starttimes = first_seen  # the order they were first sampled in: the order they started
        jobs.append(job)
    results = {job.workload.name: {**job_results(job), "processes_detail": process_results(job)} for job in jobs}
    emit_report(lambda: print_tables(jobs, results, record["header"]), str(out / "report.md"))
    return 1 if any(failed(r) for r in results.values()) else 0


if __name__ == "__main__":
    main()
