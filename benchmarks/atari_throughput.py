"""Atari steps/s, one after the other, --steps of Breakout-v5 (seed 1) each: ``cleanrl``, CleanRL's
``ppo_atari_envpool.py`` unchanged (results/rows.py's CLEANRL_COMMIT) in its own environment on one core; ``ddprl-1``,
ddprl's Atari preset (the same keys) on that core; ``ddprl-2``, 2 ranks with cpu_bind=cores on two. Measured alike: env
steps from the end of the first iteration (1,024 steps) to the end of the last over the time between (CleanRL: its
``SPS:`` lines as read; ddprl: metrics.jsonl); beside each program's own figure. Probes first: the EnvPool worker
threads each program starts on its cores, and each EnvPool release stepping 8 games alone on one thread.

    python benchmarks/atari_throughput.py [--steps 102400] [--repeats 1] [--cores 0,1] [--only cleanrl,ddprl-1,ddprl-2]
        [--cleanrl /work/cleanrl-checkout] [--cleanrl-python /work/cleanrl-atari-venv/bin/python] [--out F.json]

CleanRL's environment (gym's old API: EnvPool 0.8.4 with gym 0.23.1 on Python 3.11):
    python3.11 -m venv /work/cleanrl-atari-venv && /work/cleanrl-atari-venv/bin/pip install torch==2.13.0 \\
        envpool==0.8.4 gym==0.23.1 gymnasium==0.29.1 numpy==1.24.4 tyro tensorboard
    git clone https://github.com/vwxyzjn/cleanrl /work/cleanrl-checkout && git -C /work/cleanrl-checkout checkout COMMIT
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness as h
from results.peers import check_checkout
from results.rows import CLEANRL_CLONE, CLEANRL_COMMIT

from ddprl.timesplit import PHASES, shares

TASK, SEED, ITERATION, WARMUP = "Breakout-v5", 1, 8 * 128, 1  # 8 envs x 128 steps: CleanRL's and the preset's
SCRIPT, RUNS = "cleanrl/ppo_atari_envpool.py", ("cleanrl", "ddprl-1", "ddprl-2")
TARGETS = (("ddprl-1", "cleanrl", 1.0), ("ddprl-2", "ddprl-1", 1.8))  # the issue's: run / base >= goal
PACKAGES = ("torch", "numpy", "envpool", "gym", "gymnasium", "tyro", "tensorboard")
# In either environment: the worker threads of the program's EnvPool (CleanRL's envpool.make, or ddprl's AtariVecEnv:
# the threads it adds, less the helpers a pool of one worker adds), then 8 games alone on one EnvPool thread.
PROBE = """import json, os, sys, time
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
started, before = threads() - before, threads()
pool = envpool.make(task, env_type="gym", num_envs=8, num_threads=1, episodic_life=True, reward_clip=True, seed=1)
helpers = threads() - before - 1
pool.reset()
actions = np.random.default_rng(1).integers(0, pool.action_space.n, size=(batches, 8)).astype(np.int32)
start = time.perf_counter()
for a in actions:
    pool.step(a)
rate = batches * 8 / (time.perf_counter() - start)
print(json.dumps({"threads": started - helpers, "alone_steps_per_s": rate, "envpool": envpool.__version__}))"""


def rate(points: list[tuple[int, float]], what: str) -> tuple[float, int, float]:
    """(steps/s, steps, seconds) from (step, time) at the end of each iteration, the first WARMUP left out."""
    kept = points[WARMUP - 1 :]
    if len(kept) < 2:
        raise RuntimeError(f"{what}: {len(points)} iterations, too few (--steps >= {(WARMUP + 1) * ITERATION})")
    steps, seconds = kept[-1][0] - kept[0][0], kept[-1][1] - kept[0][1]
    return steps / seconds, steps, seconds


def measures(run: dict) -> dict:
    return {"wall_s": run["wall"], "other_load": run["other"]}


def run_cleanrl(args, core: str, steps: int, threads: str) -> dict:
    flags = ["--env-id", TASK, "--total-timesteps", str(steps), "--seed", str(SEED), "--no-cuda"]
    argv = ["taskset", "-c", core, args.cleanrl_python, str(Path(args.cleanrl) / SCRIPT), *flags]
    with tempfile.TemporaryDirectory() as scratch:  # the script writes runs/ where it runs
        run = h.run(argv, env=h.ONE_THREAD, cwd=scratch, timeout=args.timeout)
    sps = [(t, int(text.split()[1])) for t, text in run["lines"] if text.startswith("SPS: ")]
    points = [((i + 1) * ITERATION, t) for i, (t, _) in enumerate(sps)]  # the n-th: the end of iteration n
    per_s, measured, seconds = rate(points, "cleanrl")
    command = f"OMP_NUM_THREADS=1 taskset -c {core} python {SCRIPT} " + " ".join(flags)
    out = dict(name="cleanrl", command=command, envpool_threads=threads, steps_per_s=per_s, own=float(sps[-1][1]))
    return out | dict(steps=points[-1][0], measured_steps=measured, measured_s=seconds, **measures(run))


def run_ddprl(args, world_size: int, cores: list[str], steps: int, threads: str) -> dict:
    cpus, name = ",".join(cores[:world_size]), f"ddprl-{world_size}"
    keys = f"task={TASK} world_size={world_size} device=cpu steps={steps} seed={SEED} progress=false eval_freq=0 "
    keys += "eval_episodes=0 checkpoint_freq=0" + " cpu_bind=cores" * (world_size > 1)
    with tempfile.TemporaryDirectory() as scratch:
        run = h.train(
            keys.split(), Path(scratch) / "run", ["taskset", "-c", cpus], env=h.ONE_THREAD, timeout=args.timeout
        )
    rows = [r for r in run["rows"] if "time/global_fps" in r]  # one an iteration
    per_s, measured, seconds = rate([(r["step"], r["wall_time"]) for r in rows], name)
    split = shares({p: sum(r.get(f"time/{p}_s", 0.0) for r in rows[WARMUP:]) for p in PHASES}, at_least=0.02)
    out = dict(name=name, command=f"OMP_NUM_THREADS=1 taskset -c {cpus} ddprl train {keys}", envpool_threads=threads)
    out |= dict(steps_per_s=per_s, own=statistics.median(r["time/global_fps"] for r in rows[WARMUP:]))
    return out | dict(steps=rows[-1]["step"], measured_steps=measured, measured_s=seconds, **measures(run), extra=split)


def print_report(args, result: dict) -> None:
    runs = {r["name"]: r for r in result["runs"]}
    print(f"Machine: {result['machine']}; {result['date']}; {result['steps']:,} steps of {TASK} a run, ", end="")
    print(f"{args.repeats} repeat(s) (median); CleanRL {CLEANRL_COMMIT[:8]}\n")
    rows = []
    for r in (runs[name] for name in RUNS if name in runs):
        vs = [
            f"{r['steps_per_s'] / runs[b]['steps_per_s']:.2f}x" if b in runs else "n/a" for b in ("cleanrl", "ddprl-1")
        ]
        cells = [f"`{r['command']}`", r["envpool_threads"], f"{r['steps_per_s']:,.0f}", *vs, f"{r['own']:,.0f}"]
        rows.append([r["name"], *cells, f"{r['other_load']:.2f}"])
    h.table(
        ["run", "command", "EnvPool threads", "steps/s", "vs cleanrl", "vs ddprl-1", "own figure", "other load"], rows
    )
    print(
        f"\nsteps/s: from the end of iteration {WARMUP} to the end of the last. Own figure: CleanRL's last `SPS` (from"
    )
    print("its start); ddprl's median `time/global_fps` (rollout + update). Other load: other processes' cores.")
    for name, r in runs.items():
        if r.get("extra"):
            print(f"- {name}'s time (`time/<phase>_s` over the measured rows, mean over ranks): {r['extra']}")
    if result["probes"]:
        print()
        probes = [
            (p["program"], p["envpool"], f"{p['threads']} ({p['cores']})", p["alone_steps_per_s"])
            for p in result["probes"]
        ]
        rows = [[*p[:3], f"{p[3]:,.0f}"] for p in probes]
        h.table(["EnvPool of", "release", "worker threads (cores given)", "8 games alone, 1 thread, 1 core"], rows)
    print("\n" + "\n".join(f"{name}: {versions}" for name, versions in result["versions"].items()))
    ratio = lambda top, base: runs[top]["steps_per_s"] / runs[base]["steps_per_s"]  # noqa: E731
    targets = [f"{t} / {b} {ratio(t, b):.2f}x (target >= {goal})" for t, b, goal in TARGETS if t in runs and b in runs]
    print("Targets: " + "; ".join(targets) if targets else "")


def main() -> None:
    p = h.parser(__doc__.replace("COMMIT", CLEANRL_COMMIT))
    p.add_argument("--steps", type=int, default=102_400, help="env steps a run (whole iterations of 1,024)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the runs, alternated; medians reported")
    p.add_argument("--cleanrl", default="/work/cleanrl-checkout", help="CleanRL's checkout at CLEANRL_COMMIT")
    p.add_argument("--cleanrl-python", default="/work/cleanrl-atari-venv/bin/python", help="its environment's python")
    p.add_argument("--cores", default="0,1", help="the cores: the first runs the 1-core rows, two the 2-rank row")
    p.add_argument("--only", default=",".join(RUNS), help=f"comma-separated runs: {', '.join(RUNS)}")
    p.add_argument("--probe-batches", type=int, default=2000, help="EnvPool alone: steps of 8 games (0: skip)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a run")
    p.add_argument("--out", help="write the results here (JSON)")
    args = p.parse_args()
    chosen, cores = [name for name in RUNS if name in args.only.split(",")], args.cores.split(",")
    if not chosen or len(cores) < 2:
        raise SystemExit(f"--only {args.only}: among {', '.join(RUNS)}; --cores {args.cores}: two cores")
    steps = args.steps // ITERATION * ITERATION
    if "cleanrl" in chosen:
        check_checkout("CleanRL", Path(args.cleanrl), CLEANRL_COMMIT, CLEANRL_CLONE, args.cleanrl_python, "see --help")
        if subprocess.run(["git", "-C", args.cleanrl, "diff", "--quiet", "HEAD", "--", SCRIPT]).returncode:
            raise SystemExit(f"--cleanrl {args.cleanrl}: {SCRIPT} was changed; this runs it as CleanRL wrote it")
    probes, threads = [], {}
    for name in chosen:  # EnvPool threads as each program makes them on the cores one of its processes has
        python = args.cleanrl_python if name == "cleanrl" else sys.executable
        envs, alone = (4, 1) if name == "ddprl-2" else (8, max(args.probe_batches, 1))  # ddprl-1's alone is the same
        argv = ["taskset", "-c", cores[0], python, "-c", PROBE, name.split("-")[0], TASK, str(envs), str(alone)]
        lines = h.run(argv, env=h.ONE_THREAD, timeout=600)["lines"]
        found = json.loads(next(text for _, text in reversed(lines) if text.startswith("{")))
        threads[name] = f"{found['threads']} for {envs} games" + " per rank" * (name == "ddprl-2")
        probes += [{"program": name, "cores": cores[0], **found}] if name != "ddprl-2" and args.probe_batches else []
        print(f"probe {name}: {found}", file=sys.stderr, flush=True)
    plan = {name: lambda r, n=name: run_ddprl(args, int(n[-1]), cores, steps, threads[n]) for name in chosen}
    plan |= {"cleanrl": lambda r: run_cleanrl(args, cores[0], steps, threads["cleanrl"])} if "cleanrl" in chosen else {}
    runs = h.alternate(plan, args.repeats, rotate=False)
    if errors := [r["error"] for rs in runs.values() for r in rs if "error" in r]:
        raise SystemExit("\n".join(errors))
    pythons = {"ddprl": sys.executable, **({"cleanrl": args.cleanrl_python} if "cleanrl" in chosen else {})}
    result = dict(task=TASK, steps=steps, seed=SEED, date=time.strftime("%Y-%m-%d %H:%M"), machine=h.machine())
    result |= dict(cleanrl_commit=CLEANRL_COMMIT, versions={n: h.versions(py, PACKAGES) for n, py in pythons.items()})
    result |= dict(probes=probes, runs=[h.middle(rs, "steps_per_s") for rs in runs.values()], all_runs=runs)
    h.report(lambda: print_report(args, result), args.report)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
