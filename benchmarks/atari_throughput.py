"""Atari throughput side by side: CleanRL's ``ppo_atari_envpool.py`` and ddprl's Atari preset.

    python benchmarks/atari_throughput.py [--steps 102400] [--repeats 1] [--out atari.json]
        [--cleanrl /work/cleanrl-checkout] [--cleanrl-python /work/cleanrl-atari-venv/bin/python]
        [--cores 0,1] [--only cleanrl,ddprl-1,ddprl-2] [--report atari.md]

One after the other on this machine, each for ``--steps`` env steps of Breakout-v5 (seed 1):

- ``cleanrl``: CleanRL's script, unchanged, from a checkout at the commit the results rows
  name (``results/rows.py``: CLEANRL_COMMIT; the script refused if changed), in its own
  environment, with its defaults (8 envs, 128 steps, 4 minibatches, 4 epochs, lr 2.5e-4
  annealed, clip 0.1, ent 0.01, the Nature CNN), on one core: ``taskset -c C0``,
  ``OMP_NUM_THREADS=1``, ``--no-cuda``; EnvPool's thread count as the script leaves it
  (EnvPool's default).
- ``ddprl-1``: ``ddprl train task=Breakout-v5 world_size=1`` (the Atari preset: the same
  keys), on the same core, ``OMP_NUM_THREADS=1``, ``device=cpu``; no evaluation
  (``eval_freq=0 eval_episodes=0``), the checkpoint at the end only (``checkpoint_freq=0``,
  written after the last row), ``progress=false``.
- ``ddprl-2``: the same at ``world_size=2 cpu_bind=cores`` under ``taskset -c C0,C1``: each
  rank on a core of its own, its EnvPool (4 games) on that core.

Steps/s are measured alike for both programs: env steps from the end of the first iteration
to the end of the last, over the wall time between them (start-up, the first iteration's
warm-up and the final checkpoint left out). CleanRL prints ``SPS:`` once an iteration (its
own figure: steps since its start over the time since, the first iteration included); this
script timestamps each of those lines as it reads them (unbuffered), and the n-th is the end of
iteration n (8 x 128 = 1,024 steps each). ddprl writes one metrics.jsonl row an iteration, at
its end, with ``step`` and ``wall_time``. The table shows each program's own figure beside it
(CleanRL's last ``SPS``; ddprl's median ``time/global_fps``, rollout and update only).

Before the runs, short probes (a few seconds) say how many worker threads each program's
EnvPool starts on the cores it is given (threads counted in ``/proc/self/task`` around the same
construction: CleanRL's ``envpool.make`` call, ddprl's ``AtariVecEnv``; EnvPool's default is
min(envs, the machine's core count, not the process's: 2 threads on core 0 of a 2-core
machine), ddprl's min(envs, the cores the process may use): 1), and how fast each EnvPool
release steps 8 games alone on one thread and one core (random actions), which separates the
emulator's speed from the trainers'.

What else differs between the two runs: the EnvPool release (below); rewards clipped to their
sign by EnvPool in CleanRL (``reward_clip=True``), by ddprl in Python from the raw score (the
same values); episodic life EnvPool's in both; a game that ended is reset by EnvPool on the
env's next step in CleanRL (that step counted as a step), at once by an extra EnvPool call in
ddprl (not counted); the rollout's frames stored as float32 by CleanRL, as bytes by ddprl.
Neither evaluates (CleanRL's script has no evaluation).

CleanRL's environment. The script reads gym's old API (``reset()`` -> obs, ``step`` -> 4
values, ``gym.spaces.Discrete``); CleanRL pins ``envpool>=0.6.4,<0.7`` and ``gym==0.23.1``
(Python < 3.11). EnvPool 1.x (ddprl's) turns ``env_type="gym"`` into Gymnasium's API and the
script stops at once (``envs.num_envs = ...``: a property without a setter); EnvPool 0.8.4
(Python 3.11 wheels) with gym 0.23.1 gives the old API, so:

    python3.11 -m venv /work/cleanrl-atari-venv
    /work/cleanrl-atari-venv/bin/pip install torch==2.13.0 envpool==0.8.4 gym==0.23.1 \\
        gymnasium==0.29.1 numpy==1.24.4 tyro tensorboard
    git clone https://github.com/vwxyzjn/cleanrl /work/cleanrl-checkout
    git -C /work/cleanrl-checkout checkout fe8d8a03c41a7ef5b523e2e354bd01c363e786bb

Targets (the issue): ddprl-1 >= 1.0x cleanrl; ddprl-2 >= 1.8x ddprl-1. The report gives the
load other processes put on the machine during each run (cores): on a shared machine a run
with a large one says little.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from machine import cpu_counters, cpu_model, emit_report, foreign_load
from results.rows import CLEANRL_COMMIT, CLEANRL_REPO

from ddprl.timesplit import PHASES, shares

TASK = "Breakout-v5"
SEED = 1
NUM_ENVS, N_STEPS = 8, 128  # CleanRL's defaults and ddprl's Atari preset
ITERATION = NUM_ENVS * N_STEPS  # env steps per iteration, in both
WARMUP = 1  # iterations left out at the start (the measure runs from the end of this one)
SCRIPT = "cleanrl/ppo_atari_envpool.py"
CLEANRL_CHECKOUT = "/work/cleanrl-checkout"
CLEANRL_PYTHON = "/work/cleanrl-atari-venv/bin/python"
RUNS = ("cleanrl", "ddprl-1", "ddprl-2")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TARGETS = (("ddprl-1", "cleanrl", 1.0), ("ddprl-2", "ddprl-1", 1.8))  # the issue's: run / base >= goal
PACKAGES = ("torch", "numpy", "envpool", "gym", "gymnasium", "tyro", "tensorboard")

# Run in either environment: the worker threads the EnvPool of a program starts (CleanRL's own
# envpool.make call, or ddprl's AtariVecEnv: the threads it adds, less the helper threads a pool
# of one worker adds), then 8 games alone on one EnvPool thread.
PROBE = """
import json, os, sys, time
import numpy as np
import envpool
program, task, num_envs, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
if program == "cleanrl":  # ppo_atari_envpool.py's call, word for word
    made = envpool.make(task, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=1)
else:
    from ddprl.envs.atari import AtariVecEnv
    made = AtariVecEnv(task, num_envs, seed=1, training=True, backend="envpool")
started = threads() - before
before = threads()
pool = envpool.make(task, env_type="gym", num_envs=8, num_threads=1, episodic_life=True, reward_clip=True, seed=1)
helpers = threads() - before - 1  # what a pool starts besides its workers (one worker here)
pool.reset()
rng = np.random.default_rng(1)
actions = rng.integers(0, pool.action_space.n, size=(batches, 8)).astype(np.int32)
start = time.perf_counter()
for a in actions:
    pool.step(a)
rate = batches * 8 / (time.perf_counter() - start)
print(json.dumps({"threads": started - helpers, "alone_steps_per_s": rate, "envpool": envpool.__version__}))
"""


@dataclass
class Run:
    """One program's run and what was read from it."""

    name: str
    command: str  # as one types it (the scratch run directory apart)
    envpool_threads: str  # per process, from the probe
    steps_per_s: float  # the measure: env steps / wall time, end of iteration WARMUP to the end
    own: float  # the program's own figure (CleanRL's last SPS, ddprl's median time/global_fps)
    steps: int  # env steps done
    measured_steps: int
    measured_s: float
    wall_s: float  # the whole command, start-up included
    other_load: float  # cores used by other processes meanwhile
    extra: dict = field(default_factory=dict)


def cores_of(spec: str) -> list[str]:
    """``0,1`` -> ['0', '1']; at least two are needed for the 2-rank run."""
    cores = [c.strip() for c in spec.split(",") if c.strip()]
    if len(cores) < 2:
        raise SystemExit(f"--cores {spec}: give two cores (the first runs the 1-core rows, both the 2-rank row)")
    return cores


def check_cleanrl(checkout: Path, python: str) -> None:
    """Refuse a python that is not there, a checkout at another commit, or a changed script."""
    if not Path(python).exists():
        raise SystemExit(f"--cleanrl-python {python}: no such file; make CleanRL's environment (see --help)")
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0 or head.stdout.strip() != CLEANRL_COMMIT:
        found = head.stdout.strip() or "no git checkout"
        raise SystemExit(
            f"--cleanrl {checkout}: {found}, not CleanRL at {CLEANRL_COMMIT}; "
            f"git clone {CLEANRL_REPO} {checkout} && git -C {checkout} checkout {CLEANRL_COMMIT}"
        )
    changed = subprocess.run(["git", "-C", str(checkout), "diff", "--quiet", "HEAD", "--", SCRIPT])
    if changed.returncode != 0:
        raise SystemExit(f"--cleanrl {checkout}: {SCRIPT} was changed; this runs it as CleanRL wrote it")


def versions(python: str) -> dict[str, str]:
    """The versions of PACKAGES that ``python`` has."""
    code = (
        "import importlib.metadata as m, json\n"
        "found = {}\n"
        f"for p in {PACKAGES!r}:\n"
        "    try: found[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def probe(python: str, program: str, cores: str, num_envs: int, batches: int) -> dict:
    """:data:`PROBE` under ``taskset -c cores``: EnvPool threads and the rate of 8 games alone."""
    argv = ["taskset", "-c", cores, python, "-c", PROBE, program, TASK, str(num_envs), str(batches)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **THREAD_ENV})
    if out.returncode != 0:
        raise RuntimeError(f"probe of {program} failed:\n" + "\n".join(out.stderr.splitlines()[-10:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_timed(argv: list[str], cwd: Path, timeout: float) -> tuple[list[tuple[float, str]], float, float]:
    """Run ``argv`` in its own session (its ranks too), stdout and stderr merged; each line with
    the monotonic time it was read. Killed, with its children, after ``timeout`` seconds or on
    an interrupt; a nonzero exit raises RuntimeError with the last lines. Returns the lines,
    the wall time and the load of other processes meanwhile (cores)."""
    before = cpu_counters()
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **THREAD_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines: list[tuple[float, str]] = []
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
        code = proc.wait()
    except BaseException:
        kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    wall = time.monotonic() - start
    load = foreign_load(before, cpu_counters())
    if code != 0:
        tail = "\n".join(text for _, text in lines[-20:])
        raise RuntimeError(f"{shlex.join(argv)}: exit {code} after {wall:.0f} s\n{tail}")
    return lines, wall, load


def rate(points: list[tuple[int, float]], what: str) -> tuple[float, int, float]:
    """(steps/s, steps, seconds) from (step, time) at the end of each iteration, the first
    WARMUP iterations left out."""
    kept = points[WARMUP - 1 :]
    if len(kept) < 2:
        raise RuntimeError(f"{what}: {len(points)} iterations, too few (--steps >= {(WARMUP + 1) * ITERATION})")
    steps, seconds = kept[-1][0] - kept[0][0], kept[-1][1] - kept[0][1]
    return steps / seconds, steps, seconds


def run_cleanrl(checkout: Path, python: str, core: str, steps: int, threads: str, timeout: float) -> Run:
    args = ["--env-id", TASK, "--total-timesteps", str(steps), "--seed", str(SEED), "--no-cuda"]
    argv = ["taskset", "-c", core, python, str(checkout / SCRIPT), *args]
    with tempfile.TemporaryDirectory() as scratch:  # the script writes runs/ where it runs
        lines, wall, load = run_timed(argv, Path(scratch), timeout)
    sps = [(t, int(text.split()[1])) for t, text in lines if text.startswith("SPS: ")]
    points = [((i + 1) * ITERATION, t) for i, (t, _) in enumerate(sps)]
    per_s, measured, seconds = rate(points, "cleanrl")
    command = f"OMP_NUM_THREADS=1 taskset -c {core} python {SCRIPT} " + " ".join(args)
    return Run("cleanrl", command, threads, per_s, float(sps[-1][1]), points[-1][0], measured, seconds, wall, load)


def ddprl_keys(world_size: int, steps: int) -> list[str]:
    keys = [f"task={TASK}", f"world_size={world_size}", "device=cpu", f"steps={steps}", f"seed={SEED}"]
    keys += ["progress=false", "eval_freq=0", "eval_episodes=0", "checkpoint_freq=0"]
    return [*keys, "cpu_bind=cores"] if world_size > 1 else keys


def run_ddprl(world_size: int, cores: list[str], steps: int, threads: str, timeout: float) -> Run:
    cpus = ",".join(cores[:world_size])
    keys = ddprl_keys(world_size, steps)
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "run"
        argv = ["taskset", "-c", cpus, sys.executable, "-m", "ddprl", "train", *keys, f"run_dir={run_dir}"]
        _, wall, load = run_timed(argv, Path(scratch), timeout)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/global_fps" in r]  # one row an iteration
    name = f"ddprl-{world_size}"
    per_s, measured, seconds = rate([(r["step"], r["wall_time"]) for r in rows], name)
    own = statistics.median(r["time/global_fps"] for r in rows[WARMUP:])
    command = f"OMP_NUM_THREADS=1 taskset -c {cpus} ddprl train " + " ".join(keys)
    split = {p: sum(r.get(f"time/{p}_s", 0.0) for r in rows[WARMUP:]) for p in PHASES}  # mean over ranks
    run = Run(name, command, threads, per_s, own, rows[-1]["step"], measured, seconds, wall, load)
    run.extra["split"] = shares(split, at_least=0.02)
    return run


def median_run(runs: list[Run]) -> Run:
    """The run of median steps/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.steps_per_s)[(len(runs) - 1) // 2]


def print_report(args: argparse.Namespace, result: dict) -> None:
    runs = {r["name"]: r for r in result["runs"]}
    print(
        f"Machine: {result['machine']}; {result['date']}; {result['steps']:,} steps of {TASK} a run, "
        f"{args.repeats} repeat(s) (median); CleanRL {CLEANRL_COMMIT[:8]}"
    )
    print()
    print("| run | command | EnvPool threads | steps/s | vs cleanrl | vs ddprl-1 | own figure | other load |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in RUNS:
        if name not in runs:
            continue
        r = runs[name]
        vs_cleanrl = f"{r['steps_per_s'] / runs['cleanrl']['steps_per_s']:.2f}x" if "cleanrl" in runs else "n/a"
        vs_one = f"{r['steps_per_s'] / runs['ddprl-1']['steps_per_s']:.2f}x" if "ddprl-1" in runs else "n/a"
        print(
            f"| {name} | `{r['command']}` | {r['envpool_threads']} | {r['steps_per_s']:,.0f} | {vs_cleanrl} | "
            f"{vs_one} | {r['own']:,.0f} | {r['other_load']:.2f} |"
        )
    print()
    print(
        f"steps/s: env steps from the end of iteration {WARMUP} to the end of the last, over the wall time "
        "between (CleanRL: its `SPS:` lines as read; ddprl: metrics.jsonl `wall_time`). Own figure: CleanRL's "
        "last `SPS` (from its start, the first iteration included); ddprl's median `time/global_fps` "
        "(rollout + update). Other load: cores other processes used during the run."
    )
    for name in RUNS:
        split = runs.get(name, {}).get("extra", {}).get("split")
        if split:
            print(f"- {name}'s time (`time/<phase>_s` over the measured rows, mean over ranks): {split}")
    if result["probes"]:
        print()
        print("| EnvPool of | release | worker threads (cores given) | 8 games alone, 1 thread, 1 core: steps/s |")
        print("|---|---|---|---:|")
        for p in result["probes"]:
            print(
                f"| {p['program']} | {p['envpool']} | {p['threads']} ({p['cores']}) | {p['alone_steps_per_s']:,.0f} |"
            )
    print()
    for name, pkgs in result["versions"].items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in pkgs.items()))
    targets = [
        f"{top} / {base} {runs[top]['steps_per_s'] / runs[base]['steps_per_s']:.2f}x (target >= {goal})"
        for top, base, goal in TARGETS
        if top in runs and base in runs
    ]
    if targets:
        print("Targets: " + "; ".join(targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=102_400, help="env steps a run (whole iterations of 1,024)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the runs, alternated; medians reported")
    parser.add_argument("--cleanrl", default=CLEANRL_CHECKOUT, help="CleanRL's checkout at CLEANRL_COMMIT")
    parser.add_argument("--cleanrl-python", default=CLEANRL_PYTHON, help="the python of CleanRL's environment")
    parser.add_argument("--cores", default="0,1", help="the cores: the first runs the 1-core rows, two the 2-rank row")
    parser.add_argument("--only", default=",".join(RUNS), help=f"comma-separated runs: {', '.join(RUNS)}")
    parser.add_argument("--probe-batches", type=int, default=2000, help="EnvPool alone: steps of 8 games (0: skip)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a run")
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--report", help="also write the report here (markdown)")
    args = parser.parse_args()
    chosen = [name for name in RUNS if name in args.only.split(",")]
    if not chosen:
        raise SystemExit(f"--only {args.only}: none of {', '.join(RUNS)}")
    steps = args.steps // ITERATION * ITERATION
    cores = cores_of(args.cores)
    checkout = Path(args.cleanrl)
    if "cleanrl" in chosen:
        check_cleanrl(checkout, args.cleanrl_python)

    # EnvPool threads as each program makes them on the cores one of its processes has.
    plan = {
        "cleanrl": (args.cleanrl_python, "cleanrl", cores[0], NUM_ENVS),
        "ddprl-1": (sys.executable, "ddprl", cores[0], NUM_ENVS),
        "ddprl-2": (sys.executable, "ddprl", cores[0], NUM_ENVS // 2),  # a rank under cpu_bind=cores: one core
    }
    probes, threads = [], {}
    for name in chosen:
        python, program, cpus, envs = plan[name]
        alone = args.probe_batches if name != "ddprl-2" else 0  # ddprl-1's EnvPool alone is the same
        found = probe(python, program, cpus, envs, max(alone, 1))
        threads[name] = f"{found['threads']} for {envs} games" + (" per rank" if name == "ddprl-2" else "")
        if alone:
            probes.append({"program": name, "cores": cpus, **found})
        print(f"probe {name}: {found}", file=sys.stderr, flush=True)

    results: dict[str, list[Run]] = {name: [] for name in chosen}
    for repeat in range(args.repeats):
        for name in chosen:
            if name == "cleanrl":
                run = run_cleanrl(checkout, args.cleanrl_python, cores[0], steps, threads[name], args.timeout)
            else:
                world_size = int(name.split("-")[1])
                run = run_ddprl(world_size, cores, steps, threads[name], args.timeout)
            run.extra["repeat"] = repeat
            results[name].append(run)
            print(
                f"{name}: {run.steps_per_s:,.0f} steps/s (own {run.own:,.0f}; {run.wall_s:.0f} s; "
                f"other load {run.other_load:.2f} cores)",
                file=sys.stderr,
                flush=True,
            )

    pythons = {"ddprl": sys.executable, **({"cleanrl": args.cleanrl_python} if "cleanrl" in chosen else {})}
    result = {
        "task": TASK,
        "steps": steps,
        "seed": SEED,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu_model()}, {os.cpu_count()} logical cores",
        "cleanrl_commit": CLEANRL_COMMIT,
        "versions": {name: versions(python) for name, python in pythons.items()},
        "probes": probes,
        "runs": [asdict(median_run(runs)) for runs in results.values()],
        "all_runs": {name: [asdict(r) for r in runs] for name, runs in results.items()},
    }
    emit_report(lambda: print_report(args, result), args.report)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
