"""Soak: each algorithm trained --minutes at 2 ranks (a checkpoint every 10-60 s, keep_last=3), then SIGTERM; every
process of each job's tree sampled every 5 s. Checks: per process, RSS at most 5 % above, fds and threads not above, the
median of the last 30 s against 30 s from when it had used a minute of CPU (else from its first minute); never more
step files than keep_last (+1 between a save and its pruning), the newest kept, latest.pt the newest, best.pt there;
exit 75 and no process left. Writes samples.json and report.md to --out; exits 1 when a check fails.

    python benchmarks/soak.py [--minutes 30] [--only ppo,jax] [--parallel] [--out DIR]
    python benchmarks/soak.py --report DIR        # the tables again, from DIR/samples.json
"""

from __future__ import annotations

import contextlib
import filecmp
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness as h

from ddprl.checkpoint import STEP_FILE
from ddprl.metrics import metrics_path, read_metrics

SAMPLE_S, REFERENCE_S, REFERENCE_CPU_S, WINDOW_S, STOP_GRACE_S, KEEP_LAST = 5.0, 60.0, 60.0, 30.0, 300.0, 3
TICKS_A_SECOND = os.sysconf("SC_CLK_TCK")
COMMON = f"world_size=2 device=cpu progress=false keep_last={KEEP_LAST}"
WORKLOADS = {  # steps (epochs) never reached
    "ppo": "algo=ppo task=CartPole-v1 steps=1000000000 checkpoint_freq=100000 eval_freq=100000",
    "qmix": "algo=qmix task=Foraging-8x8-2p-2f-coop-v3 steps=1000000000 buffer_size=500 checkpoint_freq=30000 "
    "eval_freq=15000 eval_episodes=20",
    "tdmpc2": "algo=tdmpc2 task=walker-run model_size=1 episode_length=50 seed_steps=100 buffer_size=1000 "
    "steps=1000000000 checkpoint_freq=25 eval_freq=150 eval_episodes=2 log_freq=20",
    "supervised": "algo=supervised task=digits epochs=1000000000 patience=0 checkpoint_freq=300 eval_freq=5",
    "jax": "engine=jax task=gymnax/CartPole-v1 num_envs=32 steps=1000000000 checkpoint_freq=40960 eval_freq=24576",
}


def processes() -> dict[int, tuple[int, int, int, float]]:
    """Every live process: pid -> (parent, start time in ticks, process group, CPU-seconds used; man 5 proc)."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError):
            text = Path(f"/proc/{pid}/stat").read_text()
            if (f := text[text.rindex(")") + 2 :].split())[0] not in "ZX":  # from the state on
                table[int(pid)] = (int(f[1]), int(f[19]), int(f[2]), (int(f[11]) + int(f[12])) / TICKS_A_SECOND)
    return table


def measures(pid: int, cpu_s: float) -> dict | None:
    with contextlib.suppress(OSError):
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        values = {"rss_kb": int(status["VmRSS"].split()[0]), "threads": int(status["Threads"])}
        return {**values, "fds": len(os.listdir(f"/proc/{pid}/fd")), "cpu_s": round(cpu_s, 2)}


class Job:
    def __init__(self, name: str, out: Path):
        self.name, self.run_dir, self.seen, self.started = name, out / name, {}, time.monotonic()
        keys = f"{WORKLOADS[name]} {COMMON}".split()
        self.record = {"command": f"ddprl train {' '.join(keys)}", "roles": {}, "samples": [], "listings": []}
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(h.jax_cpu() if name == "jax" else {})}
        with open(out / f"{name}.log", "w") as log:
            cmd = [sys.executable, "-m", "ddprl", "train", *keys, f"run_dir={self.run_dir}"]
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def role(self, pid: int, parent: int) -> str:
        """launcher; tracker; rank K (the launcher's other Python children, in the order they started); launcher
        child K; or the parent's role + worker K."""
        roles, argv = self.record["roles"], [b""]
        if pid == self.proc.pid:
            return "launcher"
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if parent == self.proc.pid else argv
        if any(b"resource_tracker" in a for a in argv):
            return "tracker"
        stem = "rank" if Path(argv[0].decode()).name.startswith("python") else "launcher child"
        stem = stem if parent == self.proc.pid else f"{roles.get(str(parent), parent)} worker"
        return f"{stem} {sum(r.rsplit(' ', 1)[0] == stem for r in roles.values())}"

    def sample(self, table: dict) -> None:
        """Every process of the job's tree, parents first (by start time)."""
        tree, procs = [self.proc.pid], {}
        for pid, (parent, *_) in sorted(table.items(), key=lambda p: p[1][1]):
            tree += [pid] if parent in tree else []
        for pid in (pid for pid in tree if pid in table):
            if self.seen.get(pid) != table[pid][1]:  # new, or a reused pid
                self.seen[pid], self.record["roles"][str(pid)] = table[pid][1], self.role(pid, table[pid][0])
            if (values := measures(pid, table[pid][3])) is not None:
                procs[str(pid)] = values
        self.record["samples"].append({"t": self.now(), "procs": procs})

    def list_checkpoints(self) -> None:
        with contextlib.suppress(OSError):
            steps = sorted(int(m[1]) for f in os.listdir(self.run_dir / "checkpoints") if (m := STEP_FILE.fullmatch(f)))
            if not self.record["listings"] or self.record["listings"][-1]["steps"] != steps:
                self.record["listings"].append({"t": self.now(), "steps": steps})

    def end(self) -> None:
        """SIGKILL what is left of the job (the processes seen, the same ones, and its process group); its record."""
        table, left = processes(), []
        seen = {p for p, start in self.seen.items() if table.get(p, (0, -1))[1] == start}
        for pid in seen | {p for p, (_, _, group, _) in table.items() if group == self.proc.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                left.append(f"{self.record['roles'].get(str(pid), 'unsampled')} ({pid})")
        self.proc.wait()
        self.list_checkpoints()
        self.record |= {"exit_code": self.proc.returncode, "left_behind": left}


def soak(jobs: list[Job], seconds: float) -> None:
    """Run ``jobs`` side by side for ``seconds``, then SIGTERM; on every way out, no process of theirs is left."""
    try:
        next_sample, end = time.monotonic(), time.monotonic() + seconds
        while time.monotonic() < end and any(job.proc.poll() is None for job in jobs):
            for job in jobs:
                job.list_checkpoints()
            if time.monotonic() >= next_sample:
                table, next_sample = processes(), next_sample + SAMPLE_S
                for job in (job for job in jobs if job.proc.poll() is None):
                    job.sample(table)
            time.sleep(1.0)
        sent, running = time.monotonic(), [job for job in jobs if job.proc.poll() is None]
        for job in running:
            job.proc.send_signal(signal.SIGTERM)
        while time.monotonic() - sent < STOP_GRACE_S and any("stop_s" not in job.record for job in running):
            for job in (job for job in running if job.proc.poll() is not None):
                job.record.setdefault("stop_s", time.monotonic() - sent)
            time.sleep(0.1)
        time.sleep(5.0)  # for an ended launcher's children to end too
    finally:
        for job in jobs:
            job.end()


def window(samples: list, pid: str, start: float) -> list[float | None]:
    """The medians of RSS, fds and threads of process ``pid`` over WINDOW_S from ``start``."""
    got = [s["procs"][pid] for s in samples if start <= s["t"] <= start + WINDOW_S and pid in s["procs"]]
    return [statistics.median(v[k] for v in got) if got else None for k in ("rss_kb", "fds", "threads")]


def checkpoints(listings: list, folder: Path) -> tuple[str, str | None]:
    """The step files written / kept, and what keep_last, latest.pt or best.pt got wrong (None: nothing)."""
    written, kept = sorted(set().union(*(x["steps"] for x in listings))), listings[-1]["steps"] if listings else []
    latest, count = folder / "latest.pt", f"{len(written)} / {', '.join(map(str, kept))}"
    if len(written) <= KEEP_LAST:
        return count, f"only {len(written)} written: pruning untested"
    if max(len(x["steps"]) for x in listings) > KEEP_LAST + 1:
        return count, "too many step files at once"
    if kept != written[-KEEP_LAST:]:
        return count, f"kept {kept}, the newest written are {written[-KEEP_LAST:]}"
    if not latest.is_file() or not filecmp.cmp(latest, folder / f"step_{kept[-1]}.pt", shallow=False):
        return count, "latest.pt is not the newest step file"
    return count, None if (folder / "best.pt").is_file() else "no best.pt"


def results(name: str, job: dict, out: Path) -> tuple[list, list, bool]:
    """The job's row, its processes' rows, and whether every check passed."""
    samples, rows, ok = job["samples"], [], True
    for pid, role in job["roles"].items():
        used = [s["t"] for s in samples if pid in s["procs"] and s["procs"][pid]["cpu_s"] >= REFERENCE_CPU_S]
        start = used[0] if used else REFERENCE_S  # a rank past its warm-up, else the job's first minute
        ref, end = window(samples, pid, start), window(samples, pid, (samples[-1]["t"] if samples else 0) - WINDOW_S)
        if None in ref + end:
            rows.append([name, f"{role} ({pid})", "n/a: not in both windows", "", "", ""])
            continue
        checks = [end[0] <= ref[0] * 1.05, end[1] <= ref[1], end[2] <= ref[2]]
        rss = f"{ref[0] / 1024:.1f} → {end[0] / 1024:.1f} ({100 * (end[0] / ref[0] - 1):+.1f} %)"
        fds = f"{ref[1]:.0f} → {end[1]:.0f}, {ref[2]:.0f} → {end[2]:.0f}"
        verdict = " ".join("PASS" if c else "**FAIL**" for c in checks)
        rows.append([name, f"{role} ({pid})", f"{start:.0f}", rss, fds, verdict])
        ok &= all(checks)
    count, problem = checkpoints(job["listings"], out / name / "checkpoints")
    metrics = read_metrics(out / name) if metrics_path(out / name).is_file() else []
    stop = "n/a" if job.get("stop_s") is None else f"{job['stop_s']:.1f} s"
    evals = sum(any(k.startswith(("eval/", "val/")) for k in r) for r in metrics)
    row = [name, f"{job['exit_code']} in {stop}", max((r["step"] for r in metrics), default=None), evals]
    row += [count, problem or "PASS", ", ".join(job["left_behind"]) or "none"]
    return row, rows, ok and problem is None and job["exit_code"] == 75 and not job["left_behind"]


def report(out: Path) -> int:
    record = json.loads((out / "samples.json").read_text())
    done = {name: results(name, job, out) for name, job in record["jobs"].items()}

    with contextlib.redirect_stdout(io.StringIO()) as text:  # printed, and written to report.md
        print(record["header"] + "\n")
        head = ["workload", "exit, SIGTERM to exit", "step reached", "evaluations", "checkpoints written / kept"]
        h.table([*head, f"keep_last={KEEP_LAST}", "left running (killed here)"], [row for row, _, _ in done.values()])
        print()
        head = ["workload", "process (pid)", "reference at s", "RSS MB reference → end", "fds, threads", "checks"]
        h.table(head, [p for _, procs, _ in done.values() for p in procs])
    print(text.getvalue(), end="")
    (out / "report.md").write_text(text.getvalue())
    return 0 if all(ok for _, _, ok in done.values()) else 1


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--minutes", type=float, default=30.0, help="training time of each workload")
    p.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated workloads: {','.join(WORKLOADS)}")
    p.add_argument("--parallel", action="store_true", help="the workloads side by side, not one by one")
    p.add_argument("--out", type=Path, default=Path(time.strftime("runs/soak-%Y%m%d-%H%M%S")), help="an empty folder")
    p.add_argument("--report", type=Path, metavar="DIR", help="a soak's folder: its tables again, running nothing")
    args = p.parse_args()
    if args.report:
        sys.exit(report(args.report))
    names = args.only.split(",")
    if set(names) - set(WORKLOADS) or args.minutes * 60 < REFERENCE_S + 2 * WINDOW_S:
        raise SystemExit(f"--only {args.only}: among {','.join(WORKLOADS)}; --minutes at least 2")
    args.out.mkdir(parents=True, exist_ok=True)
    if any(args.out.iterdir()):
        raise SystemExit(f"--out {args.out}: not empty")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # out through soak's finally: no job left running
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    before, jobs = h.cpu_counters(), []
    for group in [names] if args.parallel else [[name] for name in names]:
        jobs += (started := [Job(name, args.out) for name in group])
        soak(started, args.minutes * 60)
    how = "side by side" if args.parallel else "one after the other"
    last = {(job.name, pid): v["cpu_s"] for job in jobs for s in job.record["samples"] for pid, v in s["procs"].items()}
    header = f"{h.machine()}; {time.strftime('%Y-%m-%d')}; {args.minutes:g} min of each, {how}; other load "
    header += f"{h.foreign_load(before, h.cpu_counters(), sum(last.values())):.2f} cores"
    record = {"header": header, "jobs": {job.name: job.record for job in jobs}}
    (args.out / "samples.json").write_text(json.dumps(record, indent=1))
    sys.exit(report(args.out))


if __name__ == "__main__":
    main()
