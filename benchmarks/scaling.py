"""Scaling of every algorithm: 1 rank against N ranks, on this machine, in one run.

    python benchmarks/scaling.py                       # every workload, 1 and 2 ranks
    python benchmarks/scaling.py --ranks 1 2 4 --only ppo-cartpole,qmix-lbf --out scaling.md

Each workload is a real ``ddprl train`` (a subprocess, progress off, no evaluation, no step
checkpoints), once per world size, one after the other. Its rate is read from the run's
metrics.jsonl over the rows after a warm-up: global env steps (or samples) per second of
wall time, so start-up and compilation are left out and everything else counts: collectives,
waits for the slowest rank, logging.

- weak scaling: the work per rank is fixed (envs per rank, batch per rank); efficiency =
  rate(N) / (N x rate(1)), 1.0 is perfect.
- strong scaling: the global work is fixed (the default job: 8 envs in all); speed-up =
  rate(N) / rate(1).
- time to target: the default job's wall time to its first evaluation at return 475 (start-up
  included); speed-up = seconds(1) / seconds(N).

The table also gives the time split of the N-rank run (``time/<phase>_s``, mean over ranks) so
a poor efficiency says where it went. Every workload runs N processes (the JAX engine: one CPU
device each; simulated devices in one process share its cores and do not run side by side).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from machine import cpu_model, emit_report

from ddprl.timesplit import PHASES, shares


@dataclass(frozen=True)
class Workload:
    name: str
    scaling: str  # "weak" | "strong"
    keys: Callable[[int], list[str]]  # ddprl train keys for N ranks (world_size added here)
    rate: str  # "steps" (global env steps / s over the rows) or a metric key averaged over rows
    warmup_rows: int  # rows left out at the start
    what: str  # the work per rank (weak) or in all (strong), for the table
    target: float | None = None  # report the wall time to this eval/return_mean instead of a rate


def _ppo_cartpole(n: int) -> list[str]:
    return [f"num_envs={8 * n}", f"steps={61_440 * n}"]


def _tdmpc2(n: int) -> list[str]:
    # Short episodes so that seeding and the pretraining burst (one update per seed step) end
    # early; the rows after them are the steady state: an update, a plan and an env step a step.
    return [
        "algo=tdmpc2",
        "task=walker-run",
        "model_size=1",
        "episode_length=50",
        f"seed_steps={50 * n}",
        f"log_freq={20 * n}",
        f"steps={250 * n}",
        "buffer_size=10000",
    ]


WORKLOADS = [
    Workload("ppo-default", "strong", lambda n: ["steps=61440"], "steps", 3, "8 CartPole envs in all (`ddprl train`)"),
    Workload(
        "ppo-default-target",
        "strong",
        lambda n: ["eval_freq=8192", "eval_episodes=10"],
        "steps",
        0,
        "`ddprl train` to eval return 475, seconds",
        target=475.0,
    ),
    Workload("ppo-cartpole", "weak", _ppo_cartpole, "steps", 3, "8 CartPole envs, 256 steps each"),
    Workload(
        "ppo-halfcheetah",
        "weak",
        lambda n: ["task=HalfCheetah-v5", f"num_envs={8 * n}", "n_steps=256", f"steps={2048 * 12 * n}"],
        "steps",
        2,
        "HalfCheetah preset, 8 envs x 256 steps",
    ),
    Workload(
        "qmix-lbf",
        "weak",
        lambda n: [
            "algo=qmix",
            "task=Foraging-8x8-2p-2f-coop-v3",
            f"num_envs={8 * n}",
            f"steps={60_000 * n}",
            f"log_freq={4_000 * n}",
            f"update_every={50 * n}",
            "epsilon_anneal_steps=1000",
        ],
        "steps",
        3,
        "8 LBF envs, 32 episodes an update",
    ),
    Workload("tdmpc2", "weak", _tdmpc2, "steps", 4, "1 walker-run env, model_size 1"),
    Workload(
        "supervised-digits",
        "weak",
        lambda n: ["algo=supervised", "task=digits", "epochs=12", "batch_size=32"],
        "time/samples_per_s",
        2,
        "batches of 32 (digits)",
    ),
    Workload(
        "supervised-graph",
        "weak",
        lambda n: ["algo=supervised", "task=graph_energy", "epochs=4", "batch_size=32"],
        "time/samples_per_s",
        1,
        "batches of 32 graphs (graph_energy)",
    ),
    Workload(
        "jax-ppo",
        "weak",
        lambda n: ["engine=jax", "task=gymnax/CartPole-v1", f"num_envs={16 * n}", f"steps={16 * 128 * 40 * n}"],
        "steps",
        3,
        "16 gymnax CartPole envs per process (one CPU device each)",
    ),
]


def run_job(
    workload: Workload, world_size: int, workdir: Path, timeout: float, extra: tuple[str, ...] = ()
) -> dict[str, float]:
    """One ``ddprl train``; its rate and time split (mean over ranks) over the rows after warm-up."""
    run_dir = workdir / f"{workload.name}-{world_size}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("MUJOCO_GL", "disable")
    keys = [*workload.keys(world_size), *extra, f"world_size={world_size}"]
    if "engine=jax" in keys:  # one CPU device a process, as one GPU a process would be
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
        env["JAX_PLATFORMS"] = "cpu"
    keys += ["progress=false", "checkpoint_freq=100000000", f"run_dir={run_dir}"]
    if workload.target is None and "algo=supervised" not in keys:
        keys.append("eval_episodes=0")
    cmd = [sys.executable, "-m", "ddprl", "train", *keys]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-12:])
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if workload.target is not None:  # the wall time of the first evaluation at the target (inf: never)
        hit = [r["wall_time"] for r in rows if r.get("eval/return_mean", -math.inf) >= workload.target]
        return {"rate": hit[0] if hit else math.inf, "wall": wall, **dict.fromkeys(PHASES, 0.0)}
    if workload.rate == "steps":
        rows = [r for r in rows if "time/global_fps" in r]
    else:
        rows = [r for r in rows if workload.rate in r]
    kept = rows[workload.warmup_rows :]
    if len(kept) < 2:
        raise RuntimeError(f"{workload.name} at {world_size}: {len(rows)} rows, too few after warm-up")
    if workload.rate == "steps":
        rate = (kept[-1]["step"] - kept[0]["step"]) / (kept[-1]["wall_time"] - kept[0]["wall_time"])
    else:
        rate = statistics.median(r[workload.rate] for r in kept)
    split = {p: sum(r.get(f"time/{p}_s", 0.0) for r in kept[1:]) for p in PHASES}
    return {"rate": rate, "wall": wall, **split}


CEILING_PROBE = """
import time, torch
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
opt = torch.optim.Adam(net.parameters())
x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
n, end = 0, time.perf_counter() + SECONDS
while time.perf_counter() < end:
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    opt.zero_grad()
    n += 1
print(n / SECONDS)
"""


def machine_ceiling(copies: int, seconds: float = 4.0, rounds: int = 3) -> float:
    """What N busy processes get from this machine: the rate of ``copies`` copies of a small
    CPU-bound torch loop run together, over ``copies`` times one copy alone (1.0: the cores are
    independent; below: shared physical cores, memory bandwidth or a hypervisor's steal). No
    CPU-bound training scales better than this here."""
    code = CEILING_PROBE.replace("SECONDS", str(seconds))

    def together(k: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(k)]
        return sum(float(p.communicate()[0]) for p in procs)

    # alternated, median: this machine's speed drifts over minutes (other tenants of its host)
    return statistics.median(together(copies) / (copies * together(1)) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="world sizes, the first is the base")
    names = ", ".join(w.name for w in WORKLOADS)
    parser.add_argument("--only", default="", help=f"comma-separated workload names: {names}")
    parser.add_argument("--repeats", type=int, default=3, help="runs per world size, alternated; the median is kept")
    parser.add_argument("--once", default="tdmpc2,jax-ppo", help="workloads run once whatever --repeats says")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--out", help="also write the report (markdown) here")
    parser.add_argument("--keys", nargs="*", default=[], help="ddprl keys added to every job (cpu_bind=cores)")
    args = parser.parse_args()
    chosen = [w for w in WORKLOADS if not args.only or w.name in args.only.split(",")]
    if not chosen:
        raise SystemExit(f"--only {args.only}: no such workload")
    base = args.ranks[0]
    ceilings = {n: machine_ceiling(n) for n in args.ranks if n > 1}
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in chosen:
            runs: dict[int, list[dict[str, float]]] = {n: [] for n in args.ranks}
            repeats = 1 if w.name in args.once.split(",") else args.repeats
            for r in range(repeats):  # 1, 2, 1, 2, ...: a drift of the machine's speed hits both alike
                for n in args.ranks:
                    runs[n].append(run_job(w, n, Path(tmp) / f"r{r}", args.timeout, tuple(args.keys)))
                    print(f"{w.name} x{n}: {runs[n][-1]['rate']:,.2f} ({runs[n][-1]['wall']:.0f} s)", file=sys.stderr)
            results[w.name] = {n: sorted(rs, key=lambda x: x["rate"])[len(rs) // 2] for n, rs in runs.items()}

    def report() -> None:
        day = time.strftime("%Y-%m-%d")
        print(f"Machine: {cpu_model()}, {os.cpu_count()} logical cores; {day}; ranks {args.ranks}")
        ceiling = ", ".join(f"{n} processes {c:.2f}" for n, c in ceilings.items())
        print(f"Machine ceiling (N busy processes' rate / N x one alone): {ceiling}")
        print()
        head = " | ".join(f"{n} rank{'s' if n > 1 else ''}" for n in args.ranks)
        print(f"| workload | scaling | work | {head} | efficiency / speed-up | where {args.ranks[-1]} ranks spend it |")
        print("|---|---|---|" + "---:|" * len(args.ranks) + "---:|---|")
        for w in chosen:
            res = results[w.name]
            rates = " | ".join(f"{res[n]['rate']:,.{2 if res[n]['rate'] < 100 else 0}f}" for n in args.ranks)
            top = args.ranks[-1]
            if w.target is not None:  # seconds: the base layout's over this one's
                score = f"{res[base]['rate'] / res[top]['rate']:.2f}x"
            elif w.scaling == "weak":
                score = f"{res[top]['rate'] / (top / base * res[base]['rate']):.2f}"
            else:
                score = f"{res[top]['rate'] / res[base]['rate']:.2f}x"
            split = shares({p: res[top][p] for p in PHASES}, at_least=0.05) or "n/a"
            print(f"| {w.name} | {w.scaling} | {w.what} | {rates} | {score} | {split} |")

    emit_report(report, args.out)


if __name__ == "__main__":
    main()
