"""What runs beside ddprl on the same machine: EPyMARL's QMIX (the QMIX rows' reference), CleanRL's
PPO (beside its published number on the PPO rows that name it), PureJaxRL's PPO with ddprl's two
engines (the peer rows), and random actions (a QMIX task's floor). None of these libraries is part
of ddprl: each runs from a checkout and an environment of its own."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import store, training
from .rows import (
    CLEANRL_CLONE,
    CLEANRL_COMMIT,
    CLEANRL_ROWS,
    CLEANRL_SCRIPT,
    CLEANRL_VENV,
    DEVICES,
    EPYMARL_ROWS,
    EVAL,
    PEER_ROWS,
    PUREJAXRL_CLONE,
    PUREJAXRL_COMMIT,
    PUREJAXRL_VENV,
    QMIX_EVAL_EPISODES,
    QMIX_EVAL_FREQ,
    QMIX_STEPS,
    QMIX_TASKS,
    TRAIN,
)
from .stats import curve, window_mean
from .store import HERE, ROOT, pack, read_rows, seed_summary, write_summary
from .training import seeds_to_train

RANDOM_EPISODES = 400


def random_baseline(name: str, episodes: int = RANDOM_EPISODES, seed: int = 0) -> dict:
    """The team return of uniformly random available actions on a QMIX row's task, through the
    environment ddprl trains on (8 copies, seeded ``seed``; the actions drawn from a generator
    seeded the same): the floor a learned policy has to clear. Kept as ``random.json`` in the row's
    folder (``run.py ROW --random``)."""
    import torch

    from ddprl.envs.marl import make_marl_env

    task, _ = QMIX_TASKS[name]
    env = make_marl_env(task, num_envs=8, seed=seed)
    draws = torch.Generator().manual_seed(seed)
    obs, returns = env.reset(), []
    while len(returns) < episodes:
        avail = obs.avail.flatten(0, 1).float()
        actions = torch.multinomial(avail, 1, generator=draws).view(env.num_envs, env.n_agents)
        obs, _, terminated, truncated, info = env.step(actions)
        returns += info["episode_return"][terminated | truncated].tolist()
    env.close()
    returns = returns[:episodes]
    result = {
        "task": task,
        "episodes": episodes,
        "seed": seed,
        "mean": statistics.mean(returns),
        "std": statistics.stdev(returns),
        "positive": sum(r > 0 for r in returns),
    }
    (store.RUNS / name).mkdir(parents=True, exist_ok=True)
    (store.RUNS / name / "random.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def epymarl_settings(task: str, seed: int, checkout: Path, python: str) -> argparse.Namespace:
    """qmix_learning's settings of an EPyMARL run on ``task``: EPyMARL's protocol."""
    return argparse.Namespace(
        task=task,
        steps=QMIX_STEPS,
        eval_freq=QMIX_EVAL_FREQ,
        eval_episodes=QMIX_EVAL_EPISODES,
        seed=seed,
        epymarl=str(checkout),
        epymarl_python=python,
    )


def epymarl_row_command(task: str) -> str:
    """The EPyMARL command line of a row, as one types it in EPyMARL's tree (``seed=K`` apart)."""
    from qmix_learning import epymarl_command

    args = epymarl_command(epymarl_settings(task, 0, Path("epymarl"), "python"))[3:]
    return "python src/main.py " + " ".join(a for a in args if not a.startswith("seed="))


def run_epymarl_row(
    name: str, seeds: int, checkout: Path, python: str | None, resume: bool = False, jobs: int = 1
) -> None:
    """Run EPyMARL's QMIX on the row's task, seeds 1..``seeds`` (``benchmarks/epymarl_probe.py``
    starts its unchanged ``src/main.py`` from ``checkout`` under ``python``); keep each seed's
    tests as ``seed<K>/metrics.jsonl.gz`` (``step``: the test's step on the 50k grid, ``t_env``:
    the step it ran at) and the summary, as ``training.run_row`` does. EPyMARL runs on one core
    (``OMP_NUM_THREADS=1``, its episode runner): ``jobs`` seeds run at once, each one's wall time
    measured beside the others (the summary says how many)."""
    from qmix_learning import grid_step, run_epymarl
    from qmix_speed import EPYMARL_VENV, epymarl_commit, versions

    if not python or not Path(python).exists():
        raise SystemExit(f"{name} runs EPyMARL: --epymarl-python, the python of its environment ({EPYMARL_VENV})")
    if not (checkout / "src" / "main.py").is_file():
        raise SystemExit(f"{name}: {checkout} is not an EPyMARL tree (no src/main.py)")
    task = EPYMARL_ROWS[name]
    out = store.RUNS / name
    command = epymarl_row_command(task)
    results, missing = seeds_to_train(out, name, command, seeds, resume)
    at_once = min(jobs, len(missing))
    peer = {"epymarl_commit": epymarl_commit(str(checkout)), "epymarl_versions": versions(python)}

    def one(seed: int) -> tuple[dict[int, float], float]:
        print(f"$ {command} seed={seed}  (in {checkout})", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            return run_epymarl(epymarl_settings(task, seed, checkout, python), Path(scratch))

    def keep(seed: int, run: tuple[dict[int, float], float]) -> None:
        tests, wall = run
        folder = out / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        records = [{"step": grid_step(t, QMIX_EVAL_FREQ), "t_env": t, EVAL: r} for t, r in sorted(tests.items())]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        pack(folder)
        results.append({**seed_summary(seed, round(wall, 1), curve(records)), "jobs": at_once})
        print(f"{name} seed {seed}: {results[-1]}", flush=True)
        results.sort(key=lambda s: s["seed"])
        write_summary(out, name, command, results, **peer)

    run_seeds(name, "EPyMARL", missing, at_once, one, keep)


def run_seeds(name: str, library: str, missing: list[int], at_once: int, one: Callable, keep: Callable) -> None:
    """A peer row's seeds: ``one(seed)`` for each of ``missing``, ``at_once`` of them at a time, and
    ``keep(seed, what one returned)`` as each finishes (a row stopped part-way keeps those). A seed
    whose run raised RuntimeError is said and the others go on; the row then exits nonzero."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    failed = []
    with ThreadPoolExecutor(max_workers=max(at_once, 1)) as pool:
        runs = {pool.submit(one, seed): seed for seed in missing}
        for done in as_completed(runs):
            seed = runs[done]
            try:
                result = done.result()
            except RuntimeError as e:
                print(f"{name} seed {seed}: {library} failed: {e}", flush=True)
                failed.append(seed)
                continue
            keep(seed, result)
    if failed:
        raise SystemExit(f"{name}: {library} failed on seed(s) {sorted(failed)}; `--resume` runs them again")


# What CleanRL's ppo_continuous_action.py prints: each training episode as it ends (its return as
# RecordEpisodeStatistics counts it, before the reward normalisation, a one-element array), and its
# steps per second after each iteration.
CLEANRL_EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?\s*([-+0-9.eE]+)\s*\]?")
CLEANRL_SPS = re.compile(r"SPS: (\d+)")
# One thread, one core per seed (``--jobs N`` runs N seeds at once); no display for MuJoCo; the
# output unbuffered, so that its progress reaches us as it runs.
CLEANRL_ENV = {"OMP_NUM_THREADS": "1", "MUJOCO_GL": "disable", "PYTHONUNBUFFERED": "1"}
CLEANRL_PACKAGES = ("torch", "gymnasium", "mujoco", "numpy")  # what its summary records of its environment
CLEANRL_PROGRESS = 100_000  # a line of ours every this many of a seed's steps


def cleanrl_episode(line: str) -> dict | None:
    """A training episode CleanRL printed (``global_step=8124, episodic_return=[82.50758]``) as a
    ddprl metrics record, ``{"step": 8124, TRAIN: 82.50758}``; None for its other lines."""
    match = CLEANRL_EPISODE.fullmatch(line.strip())
    return {"step": int(match[1]), TRAIN: float(match[2])} if match else None


def cleanrl_args(name: str, steps: int | None = None) -> list[str]:
    """The arguments of CleanRL's script for a CLEANRL_ROWS row (``steps``: a shorter budget), seed apart."""
    env_id, budget = CLEANRL_ROWS[name]
    return ["--env-id", env_id, "--total-timesteps", str(steps or budget), "--no-cuda"]


def cleanrl_row_command(name: str, steps: int | None = None) -> str:
    """The CleanRL command line of a row, as one types it in CleanRL's tree (``--seed K`` apart)."""
    return f"OMP_NUM_THREADS=1 python {CLEANRL_SCRIPT} " + " ".join(cleanrl_args(name, steps))


def cleanrl_argv(name: str, seed: int, checkout: Path, python: str, steps: int | None = None) -> list[str]:
    """The command that runs one seed of a row: CleanRL's script from ``checkout`` under its own ``python``."""
    return [python, str(checkout / CLEANRL_SCRIPT), *cleanrl_args(name, steps), "--seed", str(seed)]


def check_checkout(
    library: str, rows: str, checkout: Path, commit: str, clone: str, python: str | None, venv: str
) -> None:
    """Refuse no python to run a peer ``library`` with (``venv``: how to make one), or a checkout at
    another commit than ``commit`` (``clone``: how to make one at it). Its options are named after it:
    ``--cleanrl`` and ``--cleanrl-python`` (or ``$CLEANRL_PYTHON``) for CleanRL."""
    flag = library.lower()
    if not python or not Path(python).exists():
        raise SystemExit(
            f"{rows} run {library} with the python of its own environment: --{flag}-python PATH "
            f"(or {flag.upper()}_PYTHON); make one with: {venv}"
        )
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0 or head.stdout.strip() != commit:
        found = head.stdout.strip() or "no git checkout"
        raise SystemExit(f"--{flag} {checkout}: {found}, not {library} at {commit}; {clone}")


def check_cleanrl(checkout: Path, python: str | None) -> None:
    """:func:`check_checkout` for CleanRL, which also refuses a checkout whose script was changed
    (these rows run it as CleanRL wrote it)."""
    check_checkout("CleanRL", "cleanrl-* rows", checkout, CLEANRL_COMMIT, CLEANRL_CLONE, python, CLEANRL_VENV)
    changed = subprocess.run(["git", "-C", str(checkout), "diff", "--quiet", "HEAD", "--", CLEANRL_SCRIPT])
    if changed.returncode != 0:
        raise SystemExit(
            f"--cleanrl {checkout}: {CLEANRL_SCRIPT} differs from CleanRL's at {CLEANRL_COMMIT[:7]}; these rows "
            f"run it unchanged (`git -C {checkout} checkout -- {CLEANRL_SCRIPT}`)"
        )


def package_versions(python: str, packages: tuple[str, ...]) -> str:
    """'torch 2.13.0, numpy 1.26.4': the versions of ``packages`` that ``python`` has."""
    code = (
        "import importlib.metadata as m\n"
        f"for p in {packages!r}:\n"
        "    try: print(p, m.version(p))\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    try:
        found = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return ", ".join(found.splitlines())


def run_cleanrl(argv: list[str], what: str) -> tuple[list[dict], float, int | None]:
    """Run one seed of CleanRL (``argv``: :func:`cleanrl_argv`) in a scratch directory (the script
    writes ``runs/`` into its working directory); its training episodes (:func:`cleanrl_episode`),
    wall seconds and last steps per second. Its output is read as it comes, a line of ours every
    CLEANRL_PROGRESS steps; a failure raises RuntimeError with the last lines of its stderr."""
    with tempfile.TemporaryDirectory() as scratch:
        errors = Path(scratch) / "stderr.log"
        episodes: list[dict] = []
        sps, shown = None, 0
        start = time.time()
        with errors.open("w") as stderr:
            proc = subprocess.Popen(
                argv, cwd=scratch, env={**os.environ, **CLEANRL_ENV}, stdout=subprocess.PIPE, stderr=stderr, text=True
            )
            for line in proc.stdout:
                if episode := cleanrl_episode(line):
                    episodes.append(episode)
                elif match := CLEANRL_SPS.fullmatch(line.strip()):
                    sps = int(match[1])
                    if episodes and episodes[-1]["step"] >= shown + CLEANRL_PROGRESS:
                        shown = episodes[-1]["step"] // CLEANRL_PROGRESS * CLEANRL_PROGRESS
                        recent = statistics.mean(e[TRAIN] for e in episodes[-20:])
                        print(
                            f"{what}: step {episodes[-1]['step']:,}, {sps} steps/s, the last 20 episodes' mean "
                            f"return {recent:.1f}",
                            flush=True,
                        )
            code = proc.wait()
        wall = round(time.time() - start, 1)
        if code != 0:
            tail = "\n".join(errors.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"exit code {code}; the last lines of its stderr:\n{tail}")
    if not episodes:
        raise RuntimeError("it printed no training episode (`global_step=..., episodic_return=[...]`)")
    return episodes, wall, sps


def run_cleanrl_row(
    name: str,
    seeds: int,
    checkout: Path,
    python: str | None,
    resume: bool = False,
    jobs: int = 1,
    steps: int | None = None,
) -> None:
    """Run CleanRL's PPO on the row's task, seeds 1..``seeds`` (its unchanged script from
    ``checkout`` under ``python``, ``steps``: a shorter budget than the row's); keep each seed's
    training episodes as ``seed<K>/metrics.jsonl.gz`` (ddprl's ``train/episode_return`` at the
    step each ended) and the summary, as ``training.run_row`` does: per seed the wall time and the
    training episodes' return over the last 5 % of the steps, the measure set beside ddprl's. One
    core a seed: ``jobs`` seeds run at once, each one's wall time measured beside the others. A
    failed seed is said and the others go on; the row then exits nonzero."""
    check_cleanrl(checkout, python)
    budget = steps or CLEANRL_ROWS[name][1]
    out = store.RUNS / name
    command = cleanrl_row_command(name, steps)
    results, missing = seeds_to_train(out, name, command, seeds, resume)
    at_once = min(jobs, len(missing))
    peer = {
        "steps": budget,
        "cleanrl_commit": CLEANRL_COMMIT,
        "cleanrl_versions": package_versions(python, CLEANRL_PACKAGES),
    }

    def one(seed: int) -> tuple[list[dict], float, int | None]:
        print(f"$ {command} --seed {seed}  (in {checkout})", flush=True)
        return run_cleanrl(cleanrl_argv(name, seed, checkout, python, steps), f"{name} seed {seed}")

    def keep(seed: int, run: tuple[list[dict], float, int | None]) -> None:
        episodes, wall, sps = run
        folder = out / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
        pack(folder)
        returns = curve(episodes, TRAIN)
        results.append(
            {
                **seed_summary(seed, wall, returns),  # final, best: single training episodes
                "train_return": window_mean(returns, budget),
                "episodes": len(episodes),
                "sps": sps,
                "jobs": at_once,
            }
        )
        print(f"{name} seed {seed}: {results[-1]}", flush=True)
        results.sort(key=lambda s: s["seed"])
        write_summary(out, name, command, results, **peer)

    run_seeds(name, "CleanRL", missing, at_once, one, keep)


def check_purejaxrl(checkout: Path, python: str | None) -> None:
    """Refuse a checkout at another commit than PUREJAXRL_COMMIT, or no python to run it with."""
    check_checkout("PureJaxRL", "peer rows", checkout, PUREJAXRL_COMMIT, PUREJAXRL_CLONE, python, PUREJAXRL_VENV)


def jax_env(devices: int) -> dict[str, str]:
    """The environment of a JAX process on the CPU with ``devices`` simulated devices (XLA reads
    the flag when JAX starts, so it is set for the child)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return {"XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}


def impl_env(impl: str) -> dict[str, str]:
    """The environment variables a ddprl run of a peer row sets (its JAX devices; none for torch)."""
    return jax_env(DEVICES[impl]) if impl.startswith("jax") else {}


def run_purejaxrl(config: dict, seed: int, keep: Path, checkout: Path, python: str) -> float:
    """PureJaxRL's ``make_train(config)`` with PRNGKey(seed), in its own environment; its
    metrics.jsonl and result.json kept under ``keep``. Returns the command's wall time."""
    cmd = [python, str(HERE / "purejaxrl_ppo.py"), "--purejaxrl", str(checkout), "--seed", str(seed)]
    cmd += ["--out", str(keep), "--config", json.dumps(config)]
    print("$ purejaxrl_ppo.py --seed", seed, json.dumps(config), flush=True)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **jax_env(1)})
    if proc.returncode != 0:
        raise SystemExit(f"PureJaxRL seed {seed}: exited {proc.returncode}")
    pack(keep)
    return round(time.time() - start, 1)


def peer_measures(keep: Path, impl: str, wall: float, steps: int) -> dict:
    """One run's numbers for the page: the training episodes' return over the last 5 % of
    ``steps``, ddprl's last greedy evaluation, and its times (end to end, compile, training)."""
    rows = read_rows(keep)
    if impl == "purejaxrl":
        result = json.loads((keep / "result.json").read_text())
        compile_s, train_s = result["compile_s"], result["train_s"]
    elif impl.startswith("jax"):
        compile_s, train_s = rows[0].get("time/compile_s"), sum(r["time/iteration_s"] for r in rows)
    else:  # the torch engine compiles nothing here (compile=false)
        compile_s, train_s = None, sum(r["time/rollout_s"] + r["time/update_s"] for r in rows)
    evals = curve(rows)
    return {
        "wall_s": wall,
        "compile_s": None if compile_s is None else round(compile_s, 1),
        "train_s": round(train_s, 1),
        "train_return": window_mean(curve(rows, TRAIN), steps),
        "eval_return": evals[-1][1] if evals else None,
        "final_step": rows[-1]["step"],
    }


def run_peer_row(
    name: str, seeds: int, checkout: Path, python: str | None, steps: int | None = None, resume: bool = False
) -> dict:
    """Each seed: PureJaxRL, then ddprl jax (1, then 2 devices), then ddprl torch, one at a time;
    ``summary.json`` rewritten after each seed. ``resume``: keep the seeds the summary already
    holds when it ran the same commands, and run only the others (``--seeds 6`` adds 4 to 6)."""
    from machine import cpu_model

    check_purejaxrl(checkout, python)
    row = PEER_ROWS[name]
    config = row.config(steps)
    rollout = config["NUM_ENVS"] * config["NUM_STEPS"]
    budget = int(config["TOTAL_TIMESTEPS"]) // rollout * rollout  # whole updates, for every run
    out = store.RUNS / name
    commands = {
        impl: " ".join(f"{k}={v}" for k, v in impl_env(impl).items() if v)
        + " ddprl train "
        + " ".join(row.keys(impl, steps))
        for impl in row.ddprl_impls
    }
    results = []
    if resume and (out / "summary.json").exists():
        done = json.loads((out / "summary.json").read_text())
        if (done["commands"], done["purejaxrl"]["config"], done["steps"]) != (commands, config, budget):
            raise SystemExit(
                f"{name}: the kept seeds ran other commands than the row now gives; run it without --resume"
            )
        impls = ("purejaxrl", *row.ddprl_impls)
        results = [
            s
            for s in done["seeds"]
            if s["seed"] <= seeds and all((out / f"{impl}-seed{s['seed']}").is_dir() for impl in impls)
        ]
    for seed in range(1, seeds + 1):
        if any(s["seed"] == seed for s in results):
            print(f"{name} seed {seed}: kept from an earlier sitting", flush=True)
            continue
        result: dict = {"seed": seed}
        keep = out / f"purejaxrl-seed{seed}"
        wall = run_purejaxrl(config, seed, keep, checkout, python)
        result["purejaxrl"] = peer_measures(keep, "purejaxrl", wall, budget)
        for impl in row.ddprl_impls:
            keep = out / f"{impl}-seed{seed}"
            wall = training.train_and_keep(
                row.keys(impl, steps), seed, keep, f"{name} {impl} seed {seed}", impl_env(impl)
            )
            result[impl] = peer_measures(keep, impl, wall, budget)
        print(f"{name} seed {seed}: {result}", flush=True)
        results = sorted([*results, result], key=lambda s: s["seed"])
        first = results[0]["seed"]
        versions = json.loads((out / f"purejaxrl-seed{first}" / "result.json").read_text())["versions"]
        summary = {
            "row": name,
            "steps": budget,
            "commands": commands,
            "purejaxrl": {"commit": PUREJAXRL_COMMIT, "config": config, "versions": versions},
            "machine": f"{cpu_model()}, {os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d"),
            "seeds": results,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return json.loads((out / "summary.json").read_text())  # also when every seed was kept
