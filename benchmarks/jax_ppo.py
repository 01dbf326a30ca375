"""PPO time to return 475 on CartPole-v1: ddprl engine=jax vs ddprl engine=torch vs Stable-Baselines3.

Every run is a subprocess, one at a time (rows rotate between seeds), on this machine's CPU:

    pip install -e ".[jax,bench]"      # jax + gymnax (engine=jax), stable-baselines3
    python benchmarks/jax_ppo.py [--seeds 3] [--first-seed 1] [--steps 300000] [--eval-freq 8192]
        [--target 475] [--devices 2] [--world-sizes 1 2] [--skip-jax] [--skip-torch] [--skip-sb3]
        [--full-budget] [--ddprl-extra KEY=VALUE ...] [--jax-extra KEY=VALUE ...] [--max-other 0.3]
        [--retries 1] [--wait-idle 60]
        [--timeout 900] [--keep DIR] [--report FILE] [--verbose]

Rows:
    ddprl jax, N devices     ``XLA_FLAGS=--xla_force_host_platform_device_count=N python -m ddprl train
                             algo=ppo engine=jax devices=N ...``: one process, the whole iteration
                             (rollout + GAE + update) compiled once, envs sharded over N host devices.
    ddprl torch, W rank(s)   ``python -m ddprl train algo=ppo world_size=W ...`` (W=2: two DDP ranks
                             over gloo, spawned by ddprl).
    SB3 PPO                  Stable-Baselines3 ``PPO("MlpPolicy")`` on ``make_vec_env("CartPole-v1",
                             n_envs=8)`` (DummyVecEnv), ``torch.set_num_threads(1)``, device cpu; this
                             script re-run as a worker (``--sb3-worker``) so that it starts like the others.

Same settings everywhere (ddprl's PPO defaults, written out on every command line): 8 envs in all
(split over devices/ranks), n_steps 256 (2,048 steps per iteration), global minibatch --batch 256
(``batch_size`` is per rank/device in ddprl, so it gets --batch / N: every row takes 80 optimizer
steps of 256 samples per iteration), 10 epochs, Adam lr 1e-3 (eps 1e-5) annealed linearly to 0
over the --steps budget (SB3: a schedule giving iteration i exactly ddprl's 1e-3 * (1 - i / n)),
gamma 0.99, GAE 0.95, clip 0.2, ent 0, vf 0.5, grad-norm 0.5, separate 64-64 tanh actor and critic
(orthogonal init), advantages normalised. Differences SB3 does not let us remove: it normalises
advantages per minibatch (ddprl: over the whole rollout) and has no max-form value clipping
(ddprl's clip_vloss=true; SB3 runs with its default clip_range_vf=None). OMP_NUM_THREADS=1 in
every child; ddprl writes no checkpoint before the end (checkpoint_freq=0).

Evaluation: 10 deterministic episodes (argmax action) every --eval-freq global steps (a multiple
of 2,048: after the update of every 4th iteration by default, the same steps for every row), and at
the end of the budget. A run has *reached* the target at the first evaluation whose mean return is
>= --target; unless --full-budget, the run is then stopped (its process group gets SIGTERM), since
nothing after it is measured. A run that does not reach it within --steps is "not reached" and
counts as +inf in the medians.

Measured per run, at the evaluation that reached the target:
    train s         training time only: the sum of the logged per-iteration times up to and including
                    that iteration (ddprl torch: time/rollout_s + time/update_s; ddprl jax:
                    time/iteration_s; SB3: the wall time of ``learn`` minus the time of the
                    evaluations, measured by a callback). **Evaluation excluded** for all rows, and
                    start-up (imports, env creation) too. JAX: compile warm-up excluded; the
                    "incl. compile" row adds the logged time/compile_s (XLA compile of the iteration).
    loop s          wall time of the training loop up to the end of that evaluation: metrics.jsonl's
                    ``wall_time`` of that row (ddprl: from the creation of the run directory's logger,
                    just before the first iteration and, for jax, after the compile); SB3: from
                    ``learn``'s start. **Evaluation included** for all rows (for jax also the
                    compile of the evaluator at its first evaluation).
    end-to-end s    from starting the subprocess to this script seeing the row (polled every
                    0.05 s): imports, env creation, compile, evaluations, everything.
    steps/s         training steps up to that evaluation / train s (runs that did not reach: the
                    whole budget / its train s).
    other cores     CPU used meanwhile by processes outside this script's tree (/proc/stat): the
                    machine may be shared, and a busy neighbour slows every row. Before each run the
                    script waits (up to --wait-idle s) for other processes to use <= --max-other cores;
                    a run above that is redone (--retries times), the least contended run kept, and
                    still marked * when above it.
"SB3 / row" is the median of SB3's time over the median of the row's (higher: the row is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_counters, cpu_model, emit_report, foreign_load

REPO = Path(__file__).resolve().parent.parent
TASK = "CartPole-v1"
NUM_ENVS = 8
N_STEPS = 256
EPOCHS = 10
LR = 1e-3
EVAL_EPISODES = 10
ITERATION = NUM_ENVS * N_STEPS  # global steps per iteration, every row
POLL_S = 0.05


# -- SB3 worker (this script, run in a subprocess) ---------------------------------------------------


def sb3_worker(args: argparse.Namespace) -> None:
    """Train SB3 PPO, writing metrics.jsonl rows like ddprl's (step, wall_time, eval/return_mean) plus
    the cumulative training time without evaluation (time/train_s)."""
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    out = Path(args.sb3_worker)
    num_iterations = math.ceil(args.steps / ITERATION)

    def lr_schedule(progress_remaining: float) -> float:
        # SB3 calls this in train() of iteration i (0-based) with progress 1 - (i + 1) / n when
        # total_timesteps = n * 2048: adding 1 / n gives ddprl's lr * (1 - i / n).
        return LR * min(1.0, progress_remaining + 1.0 / num_iterations)

    env = make_vec_env(TASK, n_envs=NUM_ENVS, seed=args.seed)
    eval_env = make_vec_env(TASK, n_envs=EVAL_EPISODES, seed=args.seed + 1_000_000)  # one episode per env
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=N_STEPS,
        batch_size=args.batch,
        n_epochs=EPOCHS,
        learning_rate=lr_schedule if args.anneal else LR,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        clip_range_vf=None,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_advantage=True,
        target_kl=None,
        seed=args.seed,
        device="cpu",
        verbose=0,
    )

    class EvalTimer(BaseCallback):
        """Evaluate after the update of every iteration that crosses a multiple of eval_freq (at the
        start of the next rollout, where SB3 lets a callback in), the evaluation's time set apart."""

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()
            self.eval_s = 0.0
            self.last_eval = 0
            self.stop = False
            self.jsonl = open(out, "a", buffering=1)

        def _on_rollout_start(self) -> None:
            step = self.model.num_timesteps
            if step > 0 and (step // args.eval_freq) > ((step - ITERATION) // args.eval_freq):
                self.evaluate(step)

        def _on_step(self) -> bool:
            return not self.stop

        def evaluate(self, step: int) -> None:
            t_eval = time.perf_counter()
            train_s = t_eval - self.t0 - self.eval_s
            returns, _ = evaluate_policy(
                self.model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True, return_episode_rewards=True
            )
            self.eval_s += time.perf_counter() - t_eval
            mean = float(sum(returns) / len(returns))
            self.jsonl.write(
                json.dumps(
                    {
                        "step": step,
                        "wall_time": time.perf_counter() - self.t0,
                        "time/train_s": train_s,
                        "eval/return_mean": mean,
                        "time/global_fps": step / train_s,
                    }
                )
                + "\n"
            )
            self.last_eval = step
            if mean >= args.target and not args.full_budget:
                self.stop = True

    callback = EvalTimer()
    model.learn(total_timesteps=num_iterations * ITERATION, callback=callback)
    if callback.last_eval != model.num_timesteps and not callback.stop:
        callback.evaluate(model.num_timesteps)  # the end of the budget, as ddprl
    callback.jsonl.close()


# -- CPU bookkeeping (what *other* processes used while a run ran) ---------------------------------


def session_cpu(sid: int, seen: dict[int, float]) -> None:
    """Record in ``seen`` the CPU-seconds so far of every process of session ``sid`` (a run started
    with start_new_session: its ranks too, which a stopped run's parent never reaps, so that
    os.times would not count them)."""
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
        if int(fields[3]) == sid:
            seen[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick


def wait_idle(max_other: float, limit_s: float) -> float:
    """Wait (at most ``limit_s``) until other processes use at most ``max_other`` cores over a 2 s
    window; the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        before = cpu_counters()
        time.sleep(2.0)
        if foreign_load(before, cpu_counters()) <= max_other:
            break
    return time.perf_counter() - start


# -- one run ---------------------------------------------------------------------------------------


def child_env(jax_devices: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if jax_devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={jax_devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def ddprl_command(args: argparse.Namespace, kind: str, n: int, seed: int, run_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "ddprl", "train", "algo=ppo", f"task={TASK}"]
    cmd += ["engine=jax", f"devices={n}"] if kind == "jax" else [f"world_size={n}"]
    cmd += [
        f"steps={args.steps}",
        f"num_envs={NUM_ENVS}",
        f"n_steps={N_STEPS}",
        f"batch_size={args.batch // n}",
        f"epochs={EPOCHS}",
        f"lr={LR}",
        f"anneal_lr={str(args.anneal).lower()}",
        f"eval_freq={args.eval_freq}",
        f"eval_episodes={EVAL_EPISODES}",
        "eval_deterministic=true",
        "checkpoint_freq=0",
        f"seed={seed}",
        "progress=false",
        f"run_dir={run_dir}",
    ]
    return cmd + list(args.ddprl_extra) + (list(args.jax_extra) if kind == "jax" else [])


def sb3_command(args: argparse.Namespace, seed: int, out: Path) -> list[str]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--sb3-worker",
        str(out),
        "--seed-one",
        str(seed),
        "--steps",
        str(args.steps),
        "--eval-freq",
        str(args.eval_freq),
        "--target",
        str(args.target),
        "--batch",
        str(args.batch),
    ]
    if args.full_budget:
        cmd.append("--full-budget")
    if not args.anneal:
        cmd.append("--no-anneal")
    return cmd


def read_rows(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` from byte ``offset``; the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's own process group (it was started in a new session), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_one(args: argparse.Namespace, cmd: list[str], env: dict[str, str], metrics: Path, log: Path) -> dict[str, Any]:
    """Start ``cmd``; watch ``metrics`` for the first eval >= target; stop it there (unless
    --full-budget). Returns the rows and the end-to-end seconds to the target (None: not reached)."""
    if args.verbose:
        print("    $ " + shlex.join(cmd), flush=True)
    rows: list[dict[str, Any]] = []
    offset, e2e, stopped, polls = 0, None, False, 0
    seen: dict[int, float] = {}
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            while True:
                done = proc.poll() is not None
                new, offset = read_rows(metrics, offset)
                rows += new
                if e2e is None and any(r.get("eval/return_mean", -math.inf) >= args.target for r in new):
                    e2e = time.perf_counter() - start
                    if not args.full_budget:
                        session_cpu(proc.pid, seen)
                        stop_group(proc)
                        stopped = True
                        break
                if done:
                    break
                if time.perf_counter() - start > args.timeout:
                    stop_group(proc)
                    raise RuntimeError(f"timed out after {args.timeout:.0f} s")
                polls += 1
                if polls % 10 == 0:
                    session_cpu(proc.pid, seen)
                time.sleep(POLL_S)
        except BaseException:
            if proc.poll() is None:
                stop_group(proc)
            raise
    rows += read_rows(metrics, offset)[0]
    if not stopped and proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"exit code {proc.returncode}; last lines of the log:\n{tail}")
    return {"rows": rows, "e2e": e2e, "tree_cpu": sum(seen.values())}


def summarise(kind: str, rows: list[dict[str, Any]], e2e: float | None, target: float) -> dict[str, Any]:
    """The numbers of one run at its first eval >= target (or over the whole run when none)."""
    train_s, compile_s, reach = 0.0, 0.0, None
    evals = []
    for r in rows:
        if kind == "jax":
            train_s += r["time/iteration_s"]
            compile_s += r.get("time/compile_s", 0.0)
        elif kind == "torch":
            train_s += r["time/rollout_s"] + r["time/update_s"]
        else:  # sb3: cumulative, evaluation excluded
            train_s = r["time/train_s"]
        if "eval/return_mean" in r:
            evals.append(r["eval/return_mean"])
            if r["eval/return_mean"] >= target:
                reach = {"step": r["step"], "train_s": train_s, "loop_s": r["wall_time"]}
                break
    last = rows[-1] if rows else {"step": 0, "wall_time": float("nan")}
    result = {
        "reached": reach is not None,
        "compile_s": compile_s,
        "e2e": e2e if e2e is not None else math.inf,
        "best": max(evals) if evals else float("nan"),
        "evals": len(evals),
    }
    if reach is not None:
        result.update(reach)
        result["fps"] = reach["step"] / reach["train_s"]
    else:
        result.update(
            {
                "step": math.inf,
                "train_s": math.inf,
                "loop_s": math.inf,
                "fps": last["step"] / train_s if train_s > 0 else float("nan"),
                "budget_step": last["step"],
            }
        )
    return result


# -- the report ----------------------------------------------------------------------------------


def versions() -> str:
    import importlib.metadata as m

    out = []
    for p in ("jax", "jaxlib", "gymnax", "torch", "stable-baselines3", "gymnasium", "numpy"):
        try:
            out.append(f"{p} {m.version(p)}")
        except m.PackageNotFoundError:
            out.append(f"{p} (not installed)")
    return ", ".join(out)


def fmt_s(v: float, spec: str = ".1f") -> str:
    if v is None or v != v:
        return "-"
    return "not reached" if math.isinf(v) else format(v, spec)


def fmt_step(v: float) -> str:
    return "n/r" if math.isinf(v) else f"{v / 1000:.1f}k"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_report(
    args: argparse.Namespace, plan: list[tuple[str, str, int]], runs: dict[str, list[dict[str, Any]]], seeds: list[int]
) -> None:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"\n### PPO on {TASK}: time to eval return >= {args.target:g} (ddprl jax vs ddprl torch vs SB3)\n")
    print(
        f"Machine: {cpu_model()}, {os.cpu_count()} logical cores ({usable} usable), Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}  "
    )
    print(f"Versions: {versions()}  ")
    print(
        f"Settings: {NUM_ENVS} envs in all, n_steps {N_STEPS}, global minibatch {args.batch} (per rank/device: "
        f"{args.batch} / N), {EPOCHS} epochs, lr {LR:g} {'annealed to 0 over' if args.anneal else 'constant,'} "
        f"{args.steps:,} steps (the budget), eval {EVAL_EPISODES} deterministic episodes every {args.eval_freq:,} "
        f"steps; seeds {', '.join(map(str, seeds))}; "
        f"{'runs stopped at the target' if not args.full_budget else 'every run to the full budget'}; "
        f"OMP_NUM_THREADS=1; SB3 torch.set_num_threads(1).  "
    )
    if args.ddprl_extra:
        print(f"Extra ddprl keys: {' '.join(args.ddprl_extra)}  ")
    if args.jax_extra:
        print(
            f"Extra keys of the ddprl jax rows only (they win over the shared settings): {' '.join(args.jax_extra)}  "
        )
    print(
        "train s = training time only (rollout + update; **evaluation, start-up excluded**; jax: compile "
        "excluded unless the row says incl.). loop s = training-loop wall time to the end of the reaching "
        "evaluation (**evaluation included**; start-up and jax's iteration compile excluded). end-to-end = "
        "process start to the reaching row (everything). Medians over seeds; a seed that did not reach the "
        "target counts as +inf. SB3 / row: SB3's median over the row's.\n"
    )

    sb3 = runs.get("SB3 PPO")
    sb3_train = median([r["train_s"] for r in sb3 if "error" not in r]) if sb3 else float("nan")
    sb3_e2e = median([r["e2e"] for r in sb3 if "error" not in r]) if sb3 else float("nan")
    sb3_loop = median([r["loop_s"] for r in sb3 if "error" not in r]) if sb3 else float("nan")

    def busy(rs: list[dict[str, Any]]) -> str:
        return "*" if any(r["other"] > args.max_other for r in rs) else ""

    def ratio(base: float, value: float) -> str:
        if not (base == base and value == value) or math.isinf(base) or math.isinf(value) or value <= 0:
            return "-"
        return f"{base / value:.1f}x"

    print(
        f"| row | reached {args.target:g} | steps to {args.target:g} | train s to {args.target:g} "
        f"| SB3 / row (train s) | train steps/s | loop s (incl. eval) | SB3 / row (loop s) "
        f"| end-to-end s | SB3 / row (end-to-end) | other cores |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, kind, _n in plan:
        ok = [r for r in runs[name] if "error" not in r]
        failed = len(runs[name]) - len(ok)
        if not ok:
            print(f"| {name} | failed | | | | | | | | | |")
            continue
        variants = [("", 0.0)]
        if kind == "jax":
            variants = [(" (compile excl.)", 0.0), (" (compile incl.)", 1.0)]
        for suffix, with_compile in variants:
            train = [r["train_s"] + with_compile * r["compile_s"] for r in ok]
            loop = [r["loop_s"] + with_compile * r["compile_s"] for r in ok]
            e2e = [r["e2e"] for r in ok]
            reached = sum(r["reached"] for r in ok)
            extra = f", {failed} failed" if failed else ""
            fps = median([r["fps"] for r in ok])
            compile_note = ""
            if with_compile:
                compile_note = f" (+{median([r['compile_s'] for r in ok]):.1f} s compile)"
            print(
                f"| {name}{suffix} | {reached}/{len(ok)}{extra} | {fmt_step(median([r['step'] for r in ok]))} "
                f"| {fmt_s(median(train), '.2f')}{compile_note} | {ratio(sb3_train, median(train))} "
                f"| {fps:,.0f} | {fmt_s(median(loop), '.2f')} | {ratio(sb3_loop, median(loop))} "
                f"| {fmt_s(median(e2e))} | {ratio(sb3_e2e, median(e2e))} "
                f"| {median([r['other'] for r in ok]):.2f}{busy(ok)} |"
            )

    print(
        f"\nPer seed (steps and train s to {args.target:g}; jax train s without compile, compile apart; "
        f"n/r = not reached within {args.steps:,} steps, best eval return given):\n"
    )
    print(
        "| row | seed | steps | train s | compile s | loop s | end-to-end s | train steps/s | best eval "
        "| evals | other cores |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, kind, _n in plan:
        for seed, r in zip(seeds, runs[name], strict=False):
            if "error" in r:
                print(f"| {name} | {seed} | failed: {r['error'].splitlines()[0][:80]} | | | | | | | | |")
                continue
            comp = f"{r['compile_s']:.2f}" if kind == "jax" else "-"
            print(
                f"| {name} | {seed} | {fmt_step(r['step'])} | {fmt_s(r['train_s'], '.2f')} | {comp} "
                f"| {fmt_s(r['loop_s'], '.2f')} | {fmt_s(r['e2e'])} | {r['fps']:,.0f} | {r['best']:.1f} "
                f"| {r['evals']} | {r['other']:.2f}{busy([r])} |"
            )
    if any(r.get("other", 0) > args.max_other for rs in runs.values() for r in rs):
        print(
            f"\n\\* other processes used more than {args.max_other} cores during (one of) the run(s): "
            f"slower than on an idle machine."
        )
    print("\nCommands (seed 1, run directory a temporary one):\n")
    for name, kind, n in plan:
        tmp = Path("RUN_DIR")
        if kind == "sb3":
            cmd = sb3_command(args, 1, tmp / "metrics.jsonl")
            cmd[0], cmd[1] = "python", "benchmarks/jax_ppo.py"
            prefix = "OMP_NUM_THREADS=1 "
        else:
            cmd = ddprl_command(args, kind, n, 1, tmp)
            cmd[:3] = ["ddprl"]
            prefix = "OMP_NUM_THREADS=1 " + (
                f"XLA_FLAGS=--xla_force_host_platform_device_count={n} " if kind == "jax" else ""
            )
        print(f"    {name}: {prefix}{shlex.join(cmd)}")


def run_row(args: argparse.Namespace, name: str, kind: str, n: int, seed: int, attempt: int) -> dict[str, Any]:
    """One run of one row and seed: its summary (or {"error": ...})."""
    waited = wait_idle(args.max_other, args.wait_idle) if args.wait_idle > 0 else 0.0
    note = f" (waited {waited:.0f} s for other processes to calm down)" if waited > 3 else ""
    print(f"[{name}] seed {seed}{f' (again, {attempt + 1})' if attempt else ''} ...{note}", flush=True)
    with contextlib.ExitStack() as stack:
        if args.keep:
            slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
            tmp = Path(args.keep) / f"{slug}-seed{seed}-{attempt}"
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="jax-ppo-")))
        if kind == "sb3":
            metrics = tmp / "metrics.jsonl"
            metrics.unlink(missing_ok=True)
            cmd, env = sb3_command(args, seed, metrics), child_env()
        else:
            run_dir = tmp / "run"
            metrics = run_dir / "metrics.jsonl"
            metrics.unlink(missing_ok=True)
            cmd, env = ddprl_command(args, kind, n, seed, run_dir), child_env(n if kind == "jax" else None)
        began = cpu_counters()
        try:
            raw = run_one(args, cmd, env, metrics, tmp / "log.txt")
            result = summarise(kind, raw["rows"], raw["e2e"], args.target)
            result["other"] = foreign_load(began, cpu_counters(), raw["tree_cpu"])
        except Exception as exc:  # a failed run is reported, the others still run
            result = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"[{name}] seed {seed} failed: {result['error']}", flush=True)
            return result
    where = (
        f"reached {args.target:g} at {result['step']:,} steps"
        if result["reached"]
        else f"NOT reached in {result.get('budget_step', 0):,} steps (best eval {result['best']:.1f})"
    )
    comp = f" + {result['compile_s']:.1f} s compile" if kind == "jax" else ""
    print(
        f"[{name}] seed {seed}: {where}: train {fmt_s(result['train_s'], '.2f')} s{comp}, "
        f"loop {fmt_s(result['loop_s'], '.2f')} s, end-to-end {fmt_s(result['e2e'])} s, "
        f"{result['fps']:,.0f} train steps/s, other processes {result['other']:.2f} cores",
        flush=True,
    )
    return result


# -- main -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (medians reported)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300_000, help="step budget per run (global steps)")
    parser.add_argument(
        "--eval-freq",
        type=int,
        default=8192,
        help=f"global steps between evaluations (a multiple of {ITERATION}, the same for every row)",
    )
    parser.add_argument("--target", type=float, default=475.0, help="eval return to reach")
    parser.add_argument("--batch", type=int, default=256, help="global minibatch (ddprl per rank/device: batch / N)")
    parser.add_argument("--no-anneal", dest="anneal", action="store_false", help="constant lr (default: annealed)")
    parser.add_argument("--devices", type=int, nargs="*", default=[2], help="ddprl jax rows: host devices each")
    parser.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2], help="ddprl torch rows: ranks each")
    parser.add_argument("--skip-jax", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument(
        "--full-budget",
        action="store_true",
        help="run every run to --steps (default: stop a run at its first eval >= target)",
    )
    parser.add_argument(
        "--ddprl-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more keys for every ddprl run (both engines)"
    )
    parser.add_argument(
        "--jax-extra",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="keys for the ddprl jax rows only, e.g. settings that use many envs per device",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.3,
        metavar="CORES",
        help="a run during which other processes used more CPU than this is run again (--retries) and flagged *",
    )
    parser.add_argument(
        "--retries", type=int, default=1, help="reruns of a contended run (the least contended one is kept)"
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to use <= --max-other cores (0: do not wait)",
    )
    parser.add_argument("--keep", metavar="DIR", help="keep every run's log and metrics under DIR")
    parser.add_argument("--report", metavar="FILE", help="also write the final tables (markdown) to FILE")
    parser.add_argument("--verbose", action="store_true", help="print every run's command line")
    # internal: the SB3 worker
    parser.add_argument("--sb3-worker", metavar="METRICS_JSONL", help=argparse.SUPPRESS)
    parser.add_argument("--seed-one", dest="seed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_worker:
        sb3_worker(args)
        return
    if args.eval_freq % ITERATION:
        parser.error(
            f"--eval-freq must be a multiple of {ITERATION} (steps per iteration), so that every row "
            f"evaluates at the same steps"
        )
    for n in list(args.devices) + list(args.world_sizes):
        if NUM_ENVS % n or args.batch % n:
            parser.error(f"{n} devices/ranks: {NUM_ENVS} envs and --batch {args.batch} must divide by it")

    plan: list[tuple[str, str, int]] = []
    if not args.skip_jax:
        plan += [(f"ddprl jax, {n} device{'s' if n > 1 else ''}", "jax", n) for n in args.devices]
    if not args.skip_torch:
        plan += [(f"ddprl torch, {n} rank{'s' if n > 1 else ''}", "torch", n) for n in args.world_sizes]
    if not args.skip_sb3:
        plan.append(("SB3 PPO", "sb3", 1))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in plan}
    began_all = time.perf_counter()
    for i, seed in enumerate(seeds):
        order = plan[i % len(plan) :] + plan[: i % len(plan)]  # rotate: no row always first
        for name, kind, n in order:
            kept: dict[str, Any] = {}
            for attempt in range(args.retries + 1):
                result = run_row(args, name, kind, n, seed, attempt)
                if "error" in result:
                    kept = kept or result
                    break
                if not kept or "error" in kept or result["other"] < kept["other"]:
                    kept = result
                if result["other"] <= args.max_other:
                    break
                if attempt < args.retries:
                    print(
                        f"[{name}] seed {seed}: other processes used {result['other']:.2f} cores "
                        f"(> {args.max_other}): run again",
                        flush=True,
                    )
            runs[name].append(kept)
    print(f"[all runs: {time.perf_counter() - began_all:.0f} s]", flush=True)

    emit_report(lambda: print_report(args, plan, runs, seeds), args.report)


if __name__ == "__main__":
    main()
