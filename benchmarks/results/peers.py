"""What runs beside ddprl on the same machine, each from a checkout and an environment of its own: EPyMARL's
QMIX (the QMIX rows' reference), CleanRL's PPO (beside its published number), PureJaxRL's PPO with ddprl's two
engines (the peer rows), and random actions (a QMIX task's floor)."""

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

from . import rows as R
from . import store, training
from .stats import curve, window_mean


def random_baseline(name: str, episodes: int = 400, seed: int = 0) -> dict:
    """The team return of uniformly random available actions on a QMIX row's task (ddprl's environment, 8
    copies seeded ``seed``, the draws too), kept as ``random.json`` in the row's folder."""
    import torch

    from ddprl.envs.marl import make_marl_env

    env = make_marl_env(R.QMIX_TASKS[name][0], num_envs=8, seed=seed)
    draws, obs, returns = torch.Generator().manual_seed(seed), env.reset(), []
    while len(returns) < episodes:
        actions = torch.multinomial(obs.avail.flatten(0, 1).float(), 1, generator=draws)
        obs, _, terminated, truncated, info = env.step(actions.view(env.num_envs, env.n_agents))
        returns += info["episode_return"][terminated | truncated].tolist()
    env.close()
    returns = returns[:episodes]
    result = dict(task=R.QMIX_TASKS[name][0], episodes=episodes, seed=seed, mean=statistics.mean(returns))
    result |= dict(std=statistics.stdev(returns), positive=sum(r > 0 for r in returns))
    (store.RUNS / name).mkdir(parents=True, exist_ok=True)
    (store.RUNS / name / "random.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def run_library_row(name, seeds, resume, jobs, command, metric, one: Callable, **extra) -> None:
    """Another library's row, seeds 1..``seeds``, ``jobs`` at once (one core each): ``one(seed)`` returns the
    seed's records (ddprl's metrics format), wall seconds and more for its summary entry; each is kept as
    ``seed<K>/metrics.jsonl.gz`` and the summary rewritten, as ``training.run_row`` does."""
    out = store.RUNS / name
    results, missing = training.seeds_to_train(out, name, command, seeds, resume)

    def keep(seed: int, run: tuple[list[dict], float, dict]) -> None:
        (out / f"seed{seed}").mkdir(parents=True, exist_ok=True)
        (out / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run[0]))
        store.pack(out / f"seed{seed}")
        entry = store.seed_summary(seed, run[1], curve(run[0], metric))
        results.append({**entry, **run[2], "jobs": min(jobs, len(missing))})
        store.write_summary(out, name, command, sorted(results, key=lambda s: s["seed"]), **extra)

    training.run_seeds(name, missing, min(jobs, len(missing)), one, keep)


def epymarl_settings(task: str, seed: int, checkout: Path, python: str) -> argparse.Namespace:
    """``qmix_speed.py --learning``'s settings of an EPyMARL run on ``task``: EPyMARL's protocol."""
    protocol = dict(task=task, steps=R.QMIX_STEPS, eval_freq=R.QMIX_EVAL_FREQ, eval_episodes=R.QMIX_EVAL_EPISODES)
    return argparse.Namespace(**protocol, seed=seed, epymarl=str(checkout), epymarl_python=python)


def epymarl_row_command(task: str) -> str:
    """The EPyMARL command line of a row, as one types it in EPyMARL's tree (``seed=K`` apart)."""
    from qmix_speed import epymarl_command

    args = epymarl_command(epymarl_settings(task, 0, Path("epymarl"), "python"))[3:]
    return "python src/main.py " + " ".join(a for a in args if not a.startswith("seed="))


def run_epymarl_row(name: str, seeds: int, checkout: Path, python: str | None, resume=False, jobs=1) -> None:
    """EPyMARL's QMIX on the row's task (``benchmarks/epymarl_probe.py`` runs its unchanged ``src/main.py``);
    each seed's tests kept with ``step`` on the 50k grid and ``t_env`` the step each ran at."""
    from qmix_speed import EPYMARL_VENV, epymarl_commit, grid_step, run_epymarl, versions

    if not python or not Path(python).exists():
        raise SystemExit(f"{name} runs EPyMARL: --epymarl-python, the python of its environment ({EPYMARL_VENV})")
    if not (checkout / "src" / "main.py").is_file():
        raise SystemExit(f"{name}: {checkout} is not an EPyMARL tree (no src/main.py)")
    task, command = R.EPYMARL_ROWS[name], epymarl_row_command(R.EPYMARL_ROWS[name])

    def one(seed: int) -> tuple[list[dict], float, dict]:
        print(f"$ {command} seed={seed}  (in {checkout})", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            tests, wall = run_epymarl(epymarl_settings(task, seed, checkout, python), Path(scratch))
        tests = [{"step": grid_step(t, R.QMIX_EVAL_FREQ), "t_env": t, R.EVAL: r} for t, r in sorted(tests.items())]
        return tests, round(wall, 1), {}

    peer = {"epymarl_commit": epymarl_commit(str(checkout)), "epymarl_versions": versions(python)}
    run_library_row(name, seeds, resume, jobs, command, R.EVAL, one, **peer)


def cleanrl_episode(line: str) -> dict | None:
    """A training episode CleanRL printed, ``global_step=8124, episodic_return=[82.50758]`` (its return before
    the reward normalisation), as ``{"step": 8124, TRAIN: 82.50758}``; None for its other lines."""
    match = re.fullmatch(r"global_step=(\d+), episodic_return=\[?\s*([-+0-9.eE]+)\s*\]?", line.strip())
    return {"step": int(match[1]), R.TRAIN: float(match[2])} if match else None


def cleanrl_argv(name: str, seed: int | None = None, steps: int | None = None) -> list[str]:
    """CleanRL's script on the row's task and budget (``steps``: shorter), on the CPU, in CleanRL's tree."""
    env_id, budget = R.CLEANRL_ROWS[name]
    argv = [R.CLEANRL_SCRIPT, "--env-id", env_id, "--total-timesteps", str(steps or budget), "--no-cuda"]
    return argv + (["--seed", str(seed)] if seed else [])


def cleanrl_row_command(name: str, steps: int | None = None) -> str:
    return "OMP_NUM_THREADS=1 python " + " ".join(cleanrl_argv(name, steps=steps))


def check_checkout(library: str, checkout: Path, commit: str, clone: str, python: str | None, venv: str) -> None:
    """Refuse no python to run ``library`` with (``venv``: how to make one), or a checkout at another commit."""
    if not python or not Path(python).exists():
        raise SystemExit(f"{library} runs with its own environment's python: --{library.lower()}-python PATH; {venv}")
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0 or head.stdout.strip() != commit:
        found = head.stdout.strip() or "no git checkout"
        raise SystemExit(f"--{library.lower()} {checkout}: {found}, not {library} at {commit}; {clone}")


def run_cleanrl_row(name, seeds, checkout: Path, python, resume=False, jobs=1, steps: int | None = None) -> None:
    """CleanRL's PPO on the row's task (its unchanged script, in a scratch directory: it writes ``runs/`` where
    it runs); each seed's training episodes kept as ddprl's ``train/episode_return`` at the step each ended,
    the summary with their return over the last 5 % of the steps, the measure set beside ddprl's."""
    check_checkout("CleanRL", checkout, R.CLEANRL_COMMIT, R.CLEANRL_CLONE, python, R.CLEANRL_VENV)
    if subprocess.run(["git", "-C", str(checkout), "diff", "--quiet", "HEAD", "--", R.CLEANRL_SCRIPT]).returncode:
        raise SystemExit(f"--cleanrl {checkout}: {R.CLEANRL_SCRIPT} differs from CleanRL's at {R.CLEANRL_COMMIT[:7]}")
    budget, command = steps or R.CLEANRL_ROWS[name][1], cleanrl_row_command(name, steps)
    code = "import importlib.metadata as m\nfor p in ('torch', 'gymnasium', 'mujoco', 'numpy'):\n"
    code += " try: print(p, m.version(p))\n except Exception: pass"
    versions = ", ".join(subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.splitlines())

    def one(seed: int) -> tuple[list[dict], float, dict]:
        print(f"$ {command} --seed {seed}  (in {checkout})", flush=True)
        start, env = time.time(), {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "disable"}
        with tempfile.TemporaryDirectory() as scratch:
            argv = [python, str(checkout / R.CLEANRL_SCRIPT), *cleanrl_argv(name, seed, steps)[1:]]
            proc = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True)
        episodes = [e for line in proc.stdout.splitlines() if (e := cleanrl_episode(line))]
        if proc.returncode != 0 or not episodes:
            raise RuntimeError(f"exit {proc.returncode}, {len(episodes)} episodes; stderr ends:\n{proc.stderr[-2000:]}")
        sps = re.findall(r"SPS: (\d+)", proc.stdout)
        more = {"train_return": window_mean(curve(episodes, R.TRAIN), budget), "episodes": len(episodes)}
        return episodes, round(time.time() - start, 1), {**more, "sps": int(sps[-1]) if sps else None}

    peer = {"steps": budget, "cleanrl_commit": R.CLEANRL_COMMIT, "cleanrl_versions": versions}
    run_library_row(name, seeds, resume, jobs, command, R.TRAIN, one, **peer)


def impl_env(impl: str) -> dict[str, str]:
    """The environment of a run of a peer row: JAX on the CPU with its simulated devices (none for torch)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    flags += [f"--xla_force_host_platform_device_count={R.DEVICES[impl]}"] if R.DEVICES[impl] > 1 else []
    return {} if impl == "torch" else {"XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}


def peer_measures(keep: Path, impl: str, wall: float, steps: int) -> dict:
    """One run's numbers: the training episodes' return over the last 5 % of ``steps``, ddprl's last greedy
    evaluation, and its times (end to end, compile, training; the torch engine compiles nothing here)."""
    rows, evals = store.read_rows(keep), curve(store.read_rows(keep))
    if impl == "purejaxrl":
        compile_s, train_s = (json.loads((keep / "result.json").read_text())[k] for k in ("compile_s", "train_s"))
    elif impl.startswith("jax"):
        compile_s, train_s = rows[0].get("time/compile_s"), sum(r["time/iteration_s"] for r in rows)
    else:
        compile_s, train_s = None, sum(r["time/rollout_s"] + r["time/update_s"] for r in rows)
    result = dict(wall_s=wall, compile_s=None if compile_s is None else round(compile_s, 1), train_s=round(train_s, 1))
    result |= dict(train_return=window_mean(curve(rows, R.TRAIN), steps), eval_return=evals[-1][1] if evals else None)
    return {**result, "final_step": rows[-1]["step"]}


def run_peer_row(name: str, seeds: int, checkout: Path, python, steps: int | None = None, resume=False) -> dict:
    """Each seed: PureJaxRL, then ddprl jax (1, then 2 devices), then ddprl torch, one at a time; the summary
    rewritten after each. ``resume``: keep the seeds the summary holds when it ran the same commands."""
    from harness import cpu_model

    check_checkout("PureJaxRL", checkout, R.PUREJAXRL_COMMIT, R.PUREJAXRL_CLONE, python, R.PUREJAXRL_VENV)
    row, out, config = R.PEER_ROWS[name], store.RUNS / name, R.PEER_ROWS[name].config(steps)
    rollout = config["NUM_ENVS"] * config["NUM_STEPS"]
    budget = int(config["TOTAL_TIMESTEPS"]) // rollout * rollout  # whole updates, for every run
    env = {impl: " ".join(f"{k}={v}" for k, v in impl_env(impl).items() if v) for impl in row.ddprl_impls}
    commands = {impl: f"{env[impl]} ddprl train " + " ".join(row.keys(impl, steps)) for impl in row.ddprl_impls}
    results = []
    if resume and (out / "summary.json").exists():
        done = json.loads((out / "summary.json").read_text())
        if (done["commands"], done["purejaxrl"]["config"], done["steps"]) != (commands, config, budget):
            raise SystemExit(f"{name}: the kept seeds ran other commands than the row gives; run it without --resume")
        runs = lambda s: [out / f"{impl}-seed{s['seed']}" for impl in row.impls]  # noqa: E731
        results = [s for s in done["seeds"] if s["seed"] <= seeds and all(path.is_dir() for path in runs(s))]
    for seed in sorted(set(range(1, seeds + 1)) - {s["seed"] for s in results}):
        result: dict = {"seed": seed}
        for impl in row.impls:  # PureJaxRL's run first
            keep, what = out / f"{impl}-seed{seed}", f"{name} {impl} seed {seed}"
            if impl == "purejaxrl":  # make_train(config) with PRNGKey(seed) in its own environment: purejaxrl_ppo.py
                cmd = [python, str(store.HERE / "purejaxrl_ppo.py"), "--purejaxrl", str(checkout), "--seed", str(seed)]
                print("$ purejaxrl_ppo.py --seed", seed, json.dumps(config), flush=True)
                start, env = time.time(), {**os.environ, **impl_env("purejaxrl")}
                cmd += ["--out", str(keep), "--config", json.dumps(config)]
                if code := subprocess.run(cmd, cwd=store.ROOT, env=env).returncode:
                    raise SystemExit(f"PureJaxRL seed {seed}: exited {code}")
                store.pack(keep)
                wall = round(time.time() - start, 1)
            else:
                wall = training.train_and_keep(row.keys(impl, steps), seed, keep, what, impl_env(impl))
            result[impl] = peer_measures(keep, impl, wall, budget)
        print(f"{name} seed {seed}: {result}", flush=True)
        results = sorted([*results, result], key=lambda s: s["seed"])
        versions = json.loads((out / f"purejaxrl-seed{results[0]['seed']}" / "result.json").read_text())["versions"]
        purejaxrl = {"commit": R.PUREJAXRL_COMMIT, "config": config, "versions": versions}
        summary = {"row": name, "steps": budget, "commands": commands, "purejaxrl": purejaxrl}
        summary |= {"machine": f"{cpu_model()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d")}
        summary["seeds"] = results
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return json.loads((out / "summary.json").read_text())
