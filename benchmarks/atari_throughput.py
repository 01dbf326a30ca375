"""Atari steps/s, one after the other, --steps of Breakout-v5 (seed 1) each: ``cleanrl``, CleanRL's
``ppo_atari_envpool.py`` unchanged (results/rows.py's CLEANRL_COMMIT) in its own environment on one core; ``ddprl-1``,
ddprl's Atari preset (the same keys) on that core; ``ddprl-2``, 2 ranks with cpu_bind=cores on two, the preset's 8
games split between them (strong scaling); ``ddprl-2-weak``, the same with 8 games a rank; ``ddprl-1-pair``, two 1-rank
runs at once, a core each, their steps/s summed: what two cores give this workload with no collective; ``ddprl-1-2c``,
1 rank on two cores (``env_overlap=auto``: half the games step on the second core while the policy acts on the other
half) and ``ddprl-1-2c-sync``, the same with ``env_overlap=false`` (all games step, then the policy acts). Measured
alike: env steps from the end of the first iteration (1,024 steps) to the end of the last over the time between
(CleanRL: its ``SPS:`` lines as read; ddprl: metrics.jsonl); beside each program's own figure. A probe first counts
the EnvPool worker threads each program starts on its cores.

    python benchmarks/atari_throughput.py [--steps 102400] [--repeats 1] [--cores 0,1] [--only cleanrl,ddprl-1,...]
        [--keys compile=true] [--cleanrl /work/cleanrl-checkout] [--cleanrl-python /work/cleanrl-atari-venv/bin/python]

CleanRL's environment (gym's old API: EnvPool 0.8.4 with gym 0.23.1 on Python 3.11):
    python3.11 -m venv /work/cleanrl-atari-venv && /work/cleanrl-atari-venv/bin/pip install torch==2.13.0 \\
        envpool==0.8.4 gym==0.23.1 gymnasium==0.29.1 numpy==1.24.4 tyro tensorboard
    git clone https://github.com/vwxyzjn/cleanrl /work/cleanrl-checkout && git -C /work/cleanrl-checkout checkout COMMIT
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness as h
from results.peers import check_checkout
from results.rows import CLEANRL_CLONE, CLEANRL_COMMIT

from ddprl.timesplit import PHASES, shares

TASK, SEED, ITERATION, WARMUP = "Breakout-v5", 1, 8 * 128, 1  # 8 envs x 128 steps: CleanRL's and the preset's
SCRIPT, FPS = "cleanrl/ppo_atari_envpool.py", "time/global_fps"
RUNS = ("cleanrl", "ddprl-1", "ddprl-2", "ddprl-2-weak", "ddprl-1-pair", "ddprl-1-2c", "ddprl-1-2c-sync")
# the issue's: run / base >= goal; the pair's ratio is the machine's ceiling for any 2-core run of this workload
TARGETS = (("ddprl-1", "cleanrl", 2.5), ("ddprl-2", "ddprl-1", 1.8), ("ddprl-2-weak", "ddprl-1", 1.8))
CORES = {"ddprl-2": 2, "ddprl-2-weak": 2, "ddprl-1-2c": 2, "ddprl-1-2c-sync": 2}  # else one (the pair: one a run)
PROCESS_CORES = {"ddprl-1-2c": 2, "ddprl-1-2c-sync": 2}  # the cores one process has (a bound rank: one)
CEILING = ("ddprl-1-pair", "ddprl-1")
PACKAGES = ("torch", "numpy", "envpool", "gym", "gymnasium", "tyro", "tensorboard")
# In either environment: the worker threads of the program's EnvPool (CleanRL's envpool.make, or ddprl's AtariVecEnv),
# less the helper threads any pool adds (counted on a pool of one worker)
PROBE = """import json, os, sys
import envpool
program, task, num_envs, parts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
if program == "cleanrl":  # ppo_atari_envpool.py's call, word for word
    made = envpool.make(task, env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=1)
else:  # with parts=2, EnvPool's threads where the training loop puts them for one rank (env_split)
    from ddprl.envs.atari import AtariVecEnv
    from ddprl.runtime.placement import beside_cores
    pinned = beside_cores(sorted(os.sched_getaffinity(0))) if parts == 2 else None
    made = AtariVecEnv(task, num_envs, seed=1, training=True, backend="envpool", parts=parts, threads_on=pinned)
started, before = threads() - before, threads()
pool = envpool.make(task, env_type="gym", num_envs=8, num_threads=1, episodic_life=True, reward_clip=True, seed=1)
print(json.dumps({"threads": started - (threads() - before - 1), "envpool": envpool.__version__}))"""


def measured(name: str, points: list[tuple[int, float]], run: dict, **more) -> dict:
    """The rate from (step, time) at the end of each iteration, the first WARMUP left out."""
    return dict(name=name, steps_per_s=h.rate(points, WARMUP), other_load=run["other"], **more)


def run_cleanrl(args, core: str, steps: int) -> dict:
    flags = ["--env-id", TASK, "--total-timesteps", str(steps), "--seed", str(SEED), "--no-cuda"]
    argv = ["taskset", "-c", core, args.cleanrl_python, str(Path(args.cleanrl) / SCRIPT), *flags]
    with tempfile.TemporaryDirectory() as scratch:  # the script writes runs/ where it runs
        run = h.run(argv, env=h.ONE_THREAD, cwd=scratch, timeout=args.timeout)
    command = f"OMP_NUM_THREADS=1 taskset -c {core} python {SCRIPT} " + " ".join(flags)
    own = h.last_sps(run["lines"])
    return measured("cleanrl", h.sps_points(run["lines"], ITERATION), run, command=command, own=own)


def run_ddprl(args, name: str, cores: list[str], steps: int) -> dict:
    """One of the ddprl runs (RUNS); ``ddprl-1-pair``: two 1-rank runs started together, each on its own core."""
    if name == "ddprl-1-pair":
        with ThreadPoolExecutor(2) as pool:
            pair = list(pool.map(lambda core: run_ddprl(args, "ddprl-1", [core], steps), cores[:2]))
        summed = {k: sum(r[k] for r in pair) for k in ("steps_per_s", "own")}
        # each run's other load counts its partner, about one core
        summed["other_load"] = max(0.0, sum(r["other_load"] for r in pair) / 2 - 1)
        command = pair[0]["command"].replace(f"taskset -c {cores[0]}", f"taskset -c {{{cores[0]},{cores[1]}}}")
        return {**pair[0], **summed, "name": name, "command": f"{command}, one a core at once", "split": ""}
    world_size = 1 if name.startswith("ddprl-1") else 2
    cpus = ",".join(cores[: CORES.get(name, 1)])
    # eager unless --keys compile=true: compile=auto would compile a long enough run
    keys = f"task={TASK} world_size={world_size} device=cpu steps={steps} seed={SEED} compile=false "
    keys += " ".join(h.QUIET)
    keys += " cpu_bind=cores" * (world_size > 1) + " num_envs=16" * (name == "ddprl-2-weak")
    keys += " env_overlap=false" * (name == "ddprl-1-2c-sync")
    keys += "".join(f" {key}" for key in args.keys)
    run = h.train(keys, prefix=["taskset", "-c", cpus], env=h.ONE_THREAD, timeout=args.timeout)
    rows = [r for r in run["rows"] if FPS in r]  # one an iteration
    split = shares({p: sum(r.get(f"time/{p}_s", 0.0) for r in rows[WARMUP:]) for p in PHASES}, at_least=0.02)
    command, own = f"OMP_NUM_THREADS=1 taskset -c {cpus} ddprl train {keys}", h.median(h.column(rows[WARMUP:], FPS))
    return measured(name, [(r["step"], r["wall_time"]) for r in rows], run, command=command, own=own, split=split)


def report(args, runs: dict, threads: dict, steps: int, versions: dict) -> None:
    print(f"Machine: {h.machine()}; {time.strftime('%Y-%m-%d %H:%M')}; {steps:,} steps of {TASK} a run, ", end="")
    print(f"{args.repeats} repeat(s) (median); CleanRL {CLEANRL_COMMIT[:8]}\n")
    rows, rate = [], lambda top, base: runs[top]["steps_per_s"] / runs[base]["steps_per_s"]  # noqa: E731
    for name, r in runs.items():
        vs = [f"{rate(name, b):.2f}x" if b in runs else "n/a" for b in ("cleanrl", "ddprl-1")]
        cells = [f"`{r['command']}`", threads[name], f"{r['steps_per_s']:,.0f}", *vs, f"{r['own']:,.0f}"]
        rows.append([name, *cells, f"{r['other_load']:.2f}"])
    head = ["run", "command", "EnvPool threads", "steps/s", "vs cleanrl", "vs ddprl-1", "own figure", "other load"]
    h.table(head, rows)
    print(f"\nsteps/s: from the end of iteration {WARMUP} to the end of the last. Own figure: CleanRL's last `SPS`")
    print("(from its start); ddprl's median `time/global_fps` (rollout + update). Other load: other processes' cores.")
    for name, r in runs.items():
        if r.get("split"):
            print(f"- {name}'s time (`time/<phase>_s` over the measured rows, mean over ranks): {r['split']}")
    print("\n" + "\n".join(f"{name}: {v}" for name, v in versions.items()))
    targets = [f"{t} / {b} {rate(t, b):.2f}x (target >= {goal})" for t, b, goal in TARGETS if t in runs and b in runs]
    print("Targets: " + "; ".join(targets) if targets else "")
    if "ddprl-1-2c" in runs and "ddprl-1-2c-sync" in runs:
        print(f"env_overlap on 2 cores: ddprl-1-2c / ddprl-1-2c-sync {rate('ddprl-1-2c', 'ddprl-1-2c-sync'):.2f}x")
    if all(name in runs for name in CEILING):
        print(f"Machine ceiling: {' / '.join(CEILING)} {rate(*CEILING):.2f}x (2 cores, no collective)")


def main() -> None:
    p = h.parser(__doc__.replace("COMMIT", CLEANRL_COMMIT), repeats=1)
    p.add_argument("--steps", type=int, default=102_400, help="env steps a run (whole iterations of 1,024)")
    p.add_argument("--cleanrl", default="/work/cleanrl-checkout", help="CleanRL's checkout at CLEANRL_COMMIT")
    p.add_argument("--cleanrl-python", default="/work/cleanrl-atari-venv/bin/python", help="its environment's python")
    p.add_argument("--cores", default="0,1", help="the cores: the first runs the 1-core rows, two the 2-rank row")
    p.add_argument("--only", default=",".join(RUNS), help=f"comma-separated runs: {', '.join(RUNS)}")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a run")
    p.add_argument("--keys", nargs="*", default=[], help="ddprl keys added to every ddprl run (compile=true)")
    args = p.parse_args()
    chosen, cores = [name for name in RUNS if name in args.only.split(",")], args.cores.split(",")
    if not chosen or len(cores) < 2:
        raise SystemExit(f"--only {args.only}: among {', '.join(RUNS)}; --cores {args.cores}: two cores")
    steps = args.steps // ITERATION * ITERATION
    pythons = {"ddprl": sys.executable, **({"cleanrl": args.cleanrl_python} if "cleanrl" in chosen else {})}
    if "cleanrl" in chosen:
        clone, python = CLEANRL_CLONE, args.cleanrl_python
        check_checkout("CleanRL", Path(args.cleanrl), CLEANRL_COMMIT, clone, python, "see --help", SCRIPT)
    threads = {}
    for name in chosen:  # EnvPool threads as each program makes them on the cores one of its processes has
        program, envs = name.split("-")[0], 4 if name == "ddprl-2" else 8
        on, parts = ",".join(cores[: PROCESS_CORES.get(name, 1)]), 2 if name == "ddprl-1-2c" else 1
        argv = ["taskset", "-c", on, pythons[program], "-c", PROBE, program, TASK, str(envs), str(parts)]
        lines = h.run(argv, env=h.ONE_THREAD, timeout=600)["lines"]
        found = json.loads(next(text for _, text in reversed(lines) if text.startswith("{")))
        each = {"ddprl-2": " per rank", "ddprl-2-weak": " per rank", "ddprl-1-pair": " per run"}.get(name, "")
        each += " in 2 EnvPools" * (parts == 2)
        threads[name] = f"{found['envpool']}, {found['threads']} for {envs} games{each}"
    plan = {n: lambda r, n=n: run_ddprl(args, n, cores, steps) for n in chosen}
    plan |= {"cleanrl": lambda r: run_cleanrl(args, cores[0], steps)} if "cleanrl" in chosen else {}  # keeps its place
    runs = h.alternate(plan, args.repeats, rotate=False)
    if errors := [r["error"] for rs in runs.values() for r in rs if "error" in r]:
        raise SystemExit("\n".join(errors))
    runs = {name: h.middle(runs[name], "steps_per_s") for name in chosen}
    report(args, runs, threads, steps, {name: h.versions(python, PACKAGES) for name, python in pythons.items()})


if __name__ == "__main__":
    main()
