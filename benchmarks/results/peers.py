"""What runs beside ddprl on the same machine, each from a checkout and an environment of its own: EPyMARL's
QMIX (the QMIX rows' reference), JaxMARL's QMIX (the SMAX rows'), CleanRL's PPO (beside its published number),
PureJaxRL's PPO with ddprl's two engines (the peer rows), and random actions (a QMIX task's floor)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import harness as h

from . import rows as R
from . import store, training
from .store import curve, window_mean


def random_baseline(name: str, episodes: int = 400, seed: int = 0) -> dict:
    """The team return of uniformly random available actions on a QMIX row's task (ddprl's environment, 8
    copies seeded ``seed``, the draws too), and on SMAX the battles won, kept as ``random.json`` in the row's folder."""
    import torch

    from ddprl.envs.marl import make_marl_env

    task = R.RANDOM_TASKS[name][0]
    env = make_marl_env(task, num_envs=8, seed=seed)
    draws, obs, returns, won = torch.Generator().manual_seed(seed), env.reset(), [], []
    while len(returns) < episodes:
        actions = torch.multinomial(obs.avail.flatten(0, 1).float(), 1, generator=draws)
        obs, _, terminated, truncated, info = env.step(actions.view(env.num_envs, env.n_agents))
        done = terminated | truncated
        returns += info["episode_return"][done].tolist()
        won += info["episode_won"][done].tolist() if "episode_won" in info else []
    env.close()
    returns = returns[:episodes]
    result = dict(task=task, episodes=episodes, seed=seed, mean=statistics.mean(returns))
    result |= dict(std=statistics.stdev(returns), positive=sum(r > 0 for r in returns))
    result |= dict(won=int(sum(won[:episodes]))) if won else {}
    (store.RUNS / name).mkdir(parents=True, exist_ok=True)
    (store.RUNS / name / "random.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


SEED_ARGS = {"epymarl": "seed={}", "cleanrl": "--seed {}", "jaxmarl": "alg.SEED={}"}  # each library's command


def run_library_row(
    name, seeds, resume, jobs, command, metric, one: Callable, library: dict, seed_arg: str, **extra
) -> None:
    """Another library's row, seeds 1..``seeds``, ``jobs`` at once (one core each): ``one(seed)`` returns the
    seed's records (ddprl's metrics format), wall seconds and more for its summary entry; each is kept as
    ``seed<K>/metrics.jsonl.gz`` with its provenance (``library``: :func:`library_provenance`; ``seed_arg``: how
    the library's command takes the seed, ``--seed {}``) and the summary rewritten, as ``training.run_row`` does."""
    out, origins = store.RUNS / name, {}
    results, missing = training.seeds_to_train(out, name, command, seeds, resume)

    def started(seed: int) -> tuple[list[dict], float, dict] | None:
        origins[seed] = store.code_state()  # the harness's code as the seed starts, not as it ends
        return one(seed)

    def keep(seed: int, run: tuple[list[dict], float, dict]) -> None:
        (out / f"seed{seed}").mkdir(parents=True, exist_ok=True)
        (out / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run[0]))
        store.pack(out / f"seed{seed}")
        store.write_provenance(out / f"seed{seed}", f"{command} {seed_arg.format(seed)}", origins[seed], **library)
        entry = store.seed_summary(seed, run[1], curve(run[0], metric))
        results.append({**entry, **run[2], "jobs": min(jobs, len(missing))})
        store.write_summary(out, name, command, sorted(results, key=lambda s: s["seed"]), **extra)

    training.run_seeds(name, missing, min(jobs, len(missing)), started, keep)


def library_provenance(library: str, commit: str, python: str) -> dict:
    """A peer library's fields of its runs' provenance, asked of its own environment once a row: its commit,
    Python, torch (or why none) and jax."""
    ask = "import importlib.metadata as m, platform\nprint('python', platform.python_version())\n"
    ask += "for p in ('torch', 'jax'):\n try: print(p, m.version(p))\n except m.PackageNotFoundError: pass"
    try:
        out = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    found = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    fields = {"library": library, "library_commit": commit, **{k: found.get(k) for k in ("python", "torch", "jax")}}
    why = f"no torch in {library}'s environment" if out else f"{python} did not answer"
    return fields | ({} if fields["torch"] else {"torch_note": why})


EPYMARL_TESTS = [f"test_nepisode={R.QMIX_EVAL_EPISODES}", f"test_interval={R.QMIX_EVAL_FREQ}"]
EPYMARL_TESTS += [f"log_interval={R.QMIX_EVAL_FREQ}"]  # EPyMARL's protocol: 100 greedy episodes every 50k steps


def epymarl_settings(task: str, seed: int, checkout: Path, python: str) -> argparse.Namespace:
    """The settings ``qmix_speed.epymarl_command`` reads, for EPyMARL's protocol on ``task``."""
    protocol = dict(task=task, steps=R.QMIX_STEPS, seed=seed, timeout=None)
    return argparse.Namespace(**protocol, epymarl=str(checkout), epymarl_python=python)


def epymarl_row_command(task: str) -> str:
    """The EPyMARL command line of a row, as one types it in EPyMARL's tree (``seed=K`` apart)."""
    from qmix_speed import epymarl_command

    args = epymarl_command(epymarl_settings(task, 0, Path("epymarl"), "python"), *EPYMARL_TESTS)[3:]
    return "python src/main.py " + " ".join(a for a in args if not a.startswith("seed="))


def epymarl_tests(sacred_dir: Path) -> dict[int, float]:
    """``{t_env: mean return}`` of every greedy test, from sacred's ``info.json`` (its console's lags: a mean of 5)."""
    infos = list(sacred_dir.rglob("info.json"))
    if len(infos) != 1:
        raise RuntimeError(f"expected one sacred info.json under {sacred_dir}, found {len(infos)}")
    info = json.loads(infos[0].read_text())
    values = [v["value"] if isinstance(v, dict) else v for v in info.get("test_return_mean", [])]  # jsonpickled
    return {int(t): float(v) for t, v in zip(info.get("test_return_mean_T", []), values, strict=True)}


def run_epymarl(args: argparse.Namespace, tmp: Path) -> tuple[dict[int, float], float]:
    """EPyMARL's QMIX with its tests (``args``: :func:`epymarl_settings`): the tests by ``t_env``, and its wall s."""
    from qmix_speed import epymarl_command, run_probe

    wall = run_probe(args, epymarl_command(args, *EPYMARL_TESTS), tmp)[1]["wall"]
    return epymarl_tests(tmp / "sacred"), wall


def run_epymarl_row(name: str, seeds: int, checkout: Path, python: str | None, resume=False, jobs=1) -> None:
    """EPyMARL's QMIX on the row's task (``benchmarks/epymarl_probe.py`` runs its unchanged ``src/main.py``);
    each seed's tests kept with ``step`` on the 50k grid (EPyMARL tests at the first ``t_env`` past each interval,
    drifting by up to an episode a test) and ``t_env`` the step each ran at."""
    from qmix_speed import EPYMARL_VENV, PACKAGES, epymarl_commit

    if not python or not Path(python).exists():
        raise SystemExit(f"{name} runs EPyMARL: --epymarl-python, the python of its environment ({EPYMARL_VENV})")
    if not (checkout / "src" / "main.py").is_file():
        raise SystemExit(f"{name}: {checkout} is not an EPyMARL tree (no src/main.py)")
    task, command, every = R.EPYMARL_ROWS[name], epymarl_row_command(R.EPYMARL_ROWS[name]), R.QMIX_EVAL_FREQ

    def one(seed: int) -> tuple[list[dict], float, dict]:
        print(f"$ {command} seed={seed}  (in {checkout})", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            tests, wall = run_epymarl(epymarl_settings(task, seed, checkout, python), Path(scratch))
        tests = [{"step": round(t / every) * every, "t_env": t, R.EVAL: r} for t, r in sorted(tests.items())]
        return tests, round(wall, 1), {}

    peer = {"epymarl_commit": epymarl_commit(str(checkout)), "epymarl_versions": h.versions(python, PACKAGES)}
    library = library_provenance("EPyMARL", peer["epymarl_commit"], python)
    run_library_row(name, seeds, resume, jobs, command, R.EVAL, one, library, SEED_ARGS["epymarl"], **peer)


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


def check_checkout(library: str, checkout: Path, commit: str, clone: str, python, venv: str, script="") -> None:
    """Refuse no python to run ``library`` with (``venv``: how to make one), a checkout at another commit, or one
    whose ``script`` was changed."""
    flag = f"--{library.lower()}"
    if not python or not Path(python).exists():
        raise SystemExit(f"{library} runs with its own environment's python: {flag}-python PATH; {venv}")
    if (head := h.git_head(checkout)) != commit:
        raise SystemExit(f"{flag} {checkout}: {head or 'no git checkout'}, not {library} at {commit}; {clone}")
    if script and subprocess.run(["git", "-C", str(checkout), "diff", "--quiet", "HEAD", "--", script]).returncode:
        raise SystemExit(f"{flag} {checkout}: {script} differs from {library}'s at {commit[:7]}")


def run_cleanrl_row(name, seeds, checkout: Path, python, resume=False, jobs=1, steps: int | None = None) -> None:
    """CleanRL's PPO on the row's task (its unchanged script, in a scratch directory: it writes ``runs/`` where
    it runs); each seed's training episodes kept as ddprl's ``train/episode_return`` at the step each ended,
    the summary with their return over the last 5 % of the steps, the measure set beside ddprl's."""
    check_checkout("CleanRL", checkout, R.CLEANRL_COMMIT, R.CLEANRL_CLONE, python, R.CLEANRL_VENV, R.CLEANRL_SCRIPT)
    budget, command = steps or R.CLEANRL_ROWS[name][1], cleanrl_row_command(name, steps)

    def one(seed: int) -> tuple[list[dict], float, dict]:
        print(f"$ {command} --seed {seed}  (in {checkout})", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            argv = [python, str(checkout / R.CLEANRL_SCRIPT), *cleanrl_argv(name, seed, steps)[1:]]
            run = h.run(argv, env={"OMP_NUM_THREADS": "1"}, cwd=scratch)
        lines = [line for _, line in run["lines"]]
        if not (episodes := [e for line in lines if (e := cleanrl_episode(line))]):
            raise RuntimeError("no episodes; its output ends:\n" + "\n".join(lines[-15:]))
        sps = [int(line.split()[1]) for line in lines if line.startswith("SPS: ")]
        more = {"train_return": window_mean(curve(episodes, R.TRAIN), budget), "episodes": len(episodes)}
        return episodes, round(run["wall"], 1), {**more, "sps": sps[-1] if sps else None}

    versions = h.versions(python, ("torch", "gymnasium", "mujoco", "numpy"))
    peer = {"steps": budget, "cleanrl_commit": R.CLEANRL_COMMIT, "cleanrl_versions": versions}
    library = library_provenance("CleanRL", R.CLEANRL_COMMIT, python)
    run_library_row(name, seeds, resume, jobs, command, R.TRAIN, one, library, SEED_ARGS["cleanrl"], **peer)


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
                print("$ purejaxrl_ppo.py --seed", seed, json.dumps(config), flush=True)
                cmd = [python, str(store.HERE / "purejaxrl_ppo.py"), "--purejaxrl", str(checkout), "--seed", str(seed)]
                cmd += ["--out", str(keep), "--config", json.dumps(config)]
                origin = store.code_state()
                wall = round(h.run(cmd, cwd=store.ROOT, env=impl_env("purejaxrl"))["wall"], 1)
                store.pack(keep)
                keep_purejaxrl_provenance(keep, cmd, origin)
            else:
                wall = training.train_and_keep(row.keys(impl, steps), seed, keep, what, impl_env(impl))
            result[impl] = peer_measures(keep, impl, wall, budget)
        print(f"{name} seed {seed}: {result}", flush=True)
        results = sorted([*results, result], key=lambda s: s["seed"])
        versions = json.loads((out / f"purejaxrl-seed{results[0]['seed']}" / "result.json").read_text())["versions"]
        purejaxrl = {"commit": R.PUREJAXRL_COMMIT, "config": config, "versions": versions}
        summary = {"row": name, "steps": budget, "commands": commands, "purejaxrl": purejaxrl}
        summary |= {"machine": f"{h.cpu_model()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d")}
        summary["seeds"] = results
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return json.loads((out / "summary.json").read_text())


def keep_purejaxrl_provenance(keep: Path, cmd: list[str], origin: dict) -> None:
    """A PureJaxRL run's provenance, its environment's versions and commit as its ``result.json`` recorded them."""
    result, env = json.loads((keep / "result.json").read_text()), impl_env("purejaxrl")
    command = " ".join([f"{k}={v}" for k, v in env.items() if v] + [shlex.join(cmd)])
    fields = dict(library="PureJaxRL", library_commit=result.get("purejaxrl_commit", R.PUREJAXRL_COMMIT))
    fields |= dict(python=result.get("python"), torch=None, torch_note="PureJaxRL runs on JAX (jax: its version)")
    store.write_provenance(keep, command, origin, **fields, jax=result.get("versions", {}).get("jax"))


def jaxmarl_overrides(name: str) -> dict:
    """The row's settings over JaxMARL's ``ql_rnn_smax`` configuration (the seed apart)."""
    return {**R.JAXMARL_QMIX, "MAP_NAME": R.JAXMARL_ROWS[name]}


def jaxmarl_row_command(name: str) -> str:
    """JaxMARL's QMIX on the row's battle, as ``jaxmarl_qmix.py`` runs it (its ``+alg=ql_rnn_smax`` config)."""
    settings = " ".join(f"alg.{key}={value}" for key, value in jaxmarl_overrides(name).items())
    return f"python baselines/QLearning/qmix_rnn.py +alg=ql_rnn_smax {settings}"


def run_jaxmarl_row(name: str, seeds: int, checkout: Path, python, resume=False, jobs=1) -> None:
    """JaxMARL's QMIX on the row's SMAX battle, a seed a program (``jaxmarl_qmix.py``, in JaxMARL's environment):
    each seed's greedy tests kept as ddprl's ``eval/won_mean`` and ``eval/return_mean``."""
    check_checkout("JaxMARL", checkout, R.JAXMARL_COMMIT, R.JAXMARL_CLONE, python, R.JAXMARL_VENV)
    command, overrides = jaxmarl_row_command(name), json.dumps(jaxmarl_overrides(name))

    def one(seed: int) -> tuple[list[dict], float, dict]:
        print(f"$ {command} alg.SEED={seed}  (in {checkout})", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            cmd = [python, str(store.HERE / "jaxmarl_qmix.py"), "--jaxmarl", str(checkout), "--seed", str(seed)]
            run = h.run([*cmd, "--out", scratch, "--overrides", overrides], cwd=checkout, env={"JAX_PLATFORMS": "cpu"})
            return store.read_rows(Path(scratch)), round(run["wall"], 1), {}

    peer = {"jaxmarl_commit": R.JAXMARL_COMMIT, "jaxmarl_versions": h.versions(python, ("jax", "jaxmarl", "flax"))}
    library = library_provenance("JaxMARL", R.JAXMARL_COMMIT, python)
    run_library_row(name, seeds, resume, jobs, command, R.WON, one, library, SEED_ARGS["jaxmarl"], **peer)
