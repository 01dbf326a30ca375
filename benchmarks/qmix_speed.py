"""QMIX training speed: ddprl (world_size 1 and 2, 1 or 8 envs per rank) vs EPyMARL.

EPyMARL (github.com/uoe-agents/epymarl) runs from its own tree and virtual environment, never
imported into ddprl: ``benchmarks/epymarl_probe.py`` starts its unchanged ``src/main.py`` under
its Python with timing probes. Every row is a subprocess, run one after the other:

    python benchmarks/qmix_speed.py [--task Foraging-8x8-2p-2f-coop-v3 | rware-tiny-2ag-v2]
        [--steps 100000] [--world-sizes 1 2] [--num-envs 1 8] [--peer-envs 1 8] [--seed 1] [--repeats 1]
        [--epymarl /work/peers/epymarl] [--epymarl-python /work/peers/epymarl-venv/bin/python]
        [--skip-epymarl | --skip-ddprl] [--peer-no-sacred] [--retries 1] [--report report.md]

EPyMARL's tree and environment: ``EPYMARL_VENV`` below, the commands that make them.

Same settings for every row: QMIX with EPyMARL's QMIX defaults, written out on both command
lines: batch 32 episodes per update (ddprl: 32 / world_size per rank, the same 32 in total),
buffer 5000 episodes, Adam lr 5e-4, gamma 0.99, hard target update
every 200 learner updates, epsilon 1.0 -> 0.05 over 50,000 env steps, feed-forward agent (use_rnn
false) of width 64, agent id in the observation, double Q, standardised rewards, QMIX mixer
(embed 32, 2-layer hypernetworks of 64), grad-norm clip 10, common (summed) reward; episode limit
50 (LBF) or 500 (RWARE); --steps env steps in total; one intra-op thread per process
(OMP_NUM_THREADS=1), CPU only.

Rows:
    EPyMARL episode runner    1 env, one learner update per episode (EPyMARL's default).
    EPyMARL parallel xE       ``runner=parallel batch_size_run=E`` (--peer-envs E > 1): E env
                              subprocesses, one update per E episodes (fewer updates per step).
    ddprl N ranks x E envs    ``python -m ddprl train algo=qmix world_size=N num_envs=E ...``;
                              one update per episode-limit's worth of global env steps.

Evaluation is off on both sides: ddprl ``eval_freq=0 eval_episodes=0``; EPyMARL cannot skip its
first greedy test, so it runs ``test_nepisode=E`` (its minimum) once, right after its first
training episode, and never again (``test_interval`` > --steps): before the timed window.
Checkpoints: none on either side (ddprl ``checkpoint_freq=0``, EPyMARL ``save_model=False``).
Logging stays as each side ships it: ddprl writes metrics.jsonl and TensorBoard; EPyMARL logs to
the console and to sacred's FileStorageObserver (redirected to a temporary directory) with stdout
capture "fd"; --peer-no-sacred drops the observer and the capture (measured on LBF, 1 env:
about 5-10% faster without them, within this machine's run-to-run noise).

Measured (start-up excluded): a timed window from the first record at or past --skip-frac of
--steps (default 10%: start-up, the first log interval and EPyMARL's start test fall before it)
to the last record. ddprl's records are its metrics.jsonl rows (``step``, ``wall_time``,
``train/updates``, written every log_freq steps: ddprl's 10,000, or --steps/10 when smaller,
or --log-freq); EPyMARL's are the probe's stamps after every training call of the runner
(``t_env``, ``time.perf_counter()``, learner ``train`` calls so far, seconds of test-mode calls
so far, which are taken out of the window).
    env steps/s     (steps at the last record - steps at the first) / (seconds between them)
    updates/s       learner updates in the window / the same seconds
    fps (self)      ddprl only: the mean of its own ``time/global_fps`` over the window's rows
    vs EPyMARL      the row's steps/s (and updates/s) over the EPyMARL episode runner's
    scaling eff.    ddprl: steps/s(N ranks) / (N * steps/s(1 rank)) at the same envs per rank
    final return    the mean training-episode return (summed over agents, with exploration) over
                    the last 10% of steps: EPyMARL every episode in it; ddprl the mean of the
                    ``train/episode_return`` rows in it
    wall s          the whole subprocess, start-up included
    other cores     CPU other processes on the machine used during the row; a row above
                    --max-other is redone up to --retries times (the least contended run kept)
                    and marked * if still above
With --repeats R every row runs R times (the order of the rows rotates between repeats) and the
table gives medians, with the min-max of env steps/s in brackets: on a small shared VM two runs of
the same row can differ by 20% or more, even with no other process running.
The progress line of an EPyMARL row also gives the share of its training time spent in the
learner's ``train`` and, for the 1-env row (one process), env steps per CPU-second of that
process over the window (time spent waiting for a core, when other processes crowd it, is not
counted there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_counters, cpu_model, emit_report, foreign_load

from ddprl.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "epymarl_probe.py"
# EPyMARL's tree and environment, at the default paths (sacred still imports pkg_resources, gone
# from setuptools 81; EPyMARL finds MPE in pettingzoo.mpe, which PettingZoo 1.26 moved out to mpe2)
EPYMARL_VENV = (
    "git clone https://github.com/uoe-agents/epymarl /work/peers/epymarl && "
    "git -C /work/peers/epymarl checkout cbc38c0 && python3.11 -m venv /work/peers/epymarl-venv && "
    "/work/peers/epymarl-venv/bin/pip install torch sacred pyyaml numpy gymnasium lbforaging rware scipy "
    "'setuptools<81' pettingzoo==1.24.3 pygame"
)

# the tasks this benchmark times (task_spec gives EPyMARL's key and the episode limit of any)
TASKS = ("Foraging-8x8-2p-2f-coop-v3", "rware-tiny-2ag-v2")


def task_spec(task: str) -> tuple[str, int]:
    """EPyMARL's gymma key and the episode limit of an LBF, RWARE or MPE task (MPE: the key of
    EPyMARL's PettingZoo wrapper, 25 steps as MPE's own max_cycles)."""
    if task.startswith("Foraging"):
        return f"lbforaging:{task}", 50
    if task.startswith("rware"):
        return f"rware:{task}", 500
    if task.startswith("simple_"):
        return f"pz-mpe-{task.replace('_', '-')}", 25
    raise SystemExit(f"--task {task}: an LBF (Foraging-...), RWARE (rware-...) or MPE (simple_...) task")


# The shared hyperparameters: (ddprl key, EPyMARL key, value).
SHARED = [
    ("batch_size", "batch_size", 32),
    ("buffer_size", "buffer_size", 5000),
    ("lr", "lr", 0.0005),
    ("gamma", "gamma", 0.99),
    ("target_update_interval", "target_update_interval_or_tau", 200),
    ("epsilon_start", "epsilon_start", 1.0),
    ("epsilon_finish", "epsilon_finish", 0.05),
    ("epsilon_anneal_steps", "epsilon_anneal_time", 50000),
    ("use_rnn", "use_rnn", False),
    ("hidden_dim", "hidden_dim", 64),
    ("obs_agent_id", "obs_agent_id", True),
    ("obs_last_action", "obs_last_action", False),
    ("double_q", "double_q", True),
    ("standardise_rewards", "standardise_rewards", True),
    ("mixer", "mixer", "qmix"),
    ("mixing_embed_dim", "mixing_embed_dim", 32),
    ("hypernet_layers", "hypernet_layers", 2),
    ("hypernet_embed", "hypernet_embed", 64),
    ("max_grad_norm", "grad_norm_clip", 10),
]


def _ddprl_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# -- timing windows ------------------------------------------------------------------------------


def window(records: list[tuple[float, float, float, float]], skip: float) -> dict[str, float]:
    """Rates over ``records`` = [(seconds, env steps, updates, seconds not training so far), ...]
    from the first record with steps >= ``skip`` to the last one."""
    if len(records) < 2:
        raise RuntimeError(f"only {len(records)} timing record(s): too few steps for a window")
    first = next((i for i, r in enumerate(records) if r[1] >= skip), len(records) - 1)
    first = min(first, len(records) - 2)
    (t0, s0, u0, x0), (t1, s1, u1, x1) = records[first], records[-1]
    seconds = (t1 - t0) - (x1 - x0)
    return {
        "fps": (s1 - s0) / seconds,
        "ups": (u1 - u0) / seconds,
        "window_steps": s1 - s0,
        "window_s": seconds,
        "window_from": s0,
        "steps": s1,
        "updates": u1,
    }


# -- CPU bookkeeping (what *other* processes used while a row ran) ------------------------------

# -- the rows ------------------------------------------------------------------------------------


def run_logged(cmd: list[str], log: Path, env: dict[str, str], cwd: Path, timeout: float | None) -> float:
    """Run ``cmd`` with its output in ``log``; its wall seconds. Raise with the log's tail on failure."""
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM first: both sides clean up (EPyMARL's probe, ddprl's ranks)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"exit code {proc.returncode}; last lines of the log:\n{tail}")
    return wall


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    return env


def run_epymarl(args: argparse.Namespace, envs: int, tmp: Path) -> dict[str, Any]:
    key, limit = task_spec(args.task)
    out = tmp / "probe.json"
    cmd = [
        args.epymarl_python,
        str(PROBE),
        args.epymarl,
        "--config=qmix",
        "--env-config=gymma",
        "with",
        f"env_args.key={key}",
        f"env_args.time_limit={limit}",
        f"t_max={args.steps}",
        f"seed={args.seed}",
        "use_cuda=False",
        "save_model=False",
        "use_tensorboard=False",
        "use_wandb=False",
        "common_reward=True",
        f"test_nepisode={envs}",
        f"test_interval={10 * args.steps + 1}",
    ]
    cmd += [f"{peer}={value}" for _, peer, value in SHARED]
    if envs > 1:
        cmd += ["runner=parallel", f"batch_size_run={envs}"]
    env = child_env()
    env["EPYMARL_PROBE_OUT"] = str(out)
    env["EPYMARL_PROBE_SACRED_DIR"] = str(tmp / "sacred")  # inside the row's directory, removed with it
    if args.peer_no_sacred:
        env["EPYMARL_PROBE_NO_SACRED"] = "1"
    if args.verbose:
        print("    $ " + shlex.join(cmd), flush=True)
    wall = run_logged(cmd, tmp / "epymarl.log", env, Path(args.epymarl), args.timeout)
    probe = json.loads(out.read_text())
    records = [(t, steps, updates, test_s) for t, steps, updates, _, test_s, _ in probe["calls"]]
    result = window(records, args.skip_frac * args.steps)
    if envs == 1:  # one process: steps per CPU-second of it, a rate other processes barely move
        cpu = window([(c, steps, 0, 0.0) for _, steps, _, _, _, c in probe["calls"]], args.skip_frac * args.steps)
        result["fps_cpu"] = cpu["fps"]
    # EPyMARL's one test runs right after the first training call: before the window unless --steps
    # is tiny, and its seconds are taken out of the window anyway (the records' test_s).
    result["test_s"] = probe["test_s"]
    last = [ret for _, steps, _, returns, _, _ in probe["calls"] if steps >= 0.9 * probe["t_env"] for ret in returns]
    result["return"] = sum(last) / len(last) if last else float("nan")
    result["learner_share"] = probe["train_s"] / max(probe["end"] - probe["start"] - probe["test_s"], 1e-9)
    result["wall"] = wall
    result["fps_self"] = float("nan")
    return result


def log_freq(args: argparse.Namespace) -> int:
    """ddprl's metric-row interval: --log-freq, else its default 10,000 capped at --steps/10
    (a timed window needs a few rows)."""
    return args.log_freq or max(1, min(10_000, args.steps // 10))


def run_ddprl(args: argparse.Namespace, world_size: int, envs: int, tmp: Path) -> dict[str, Any]:
    _, limit = task_spec(args.task)
    run_dir = tmp / "run"
    cmd = [
        sys.executable,
        "-m",
        "ddprl",
        "train",
        "algo=qmix",
        f"task={args.task}",
        f"steps={args.steps}",
        f"world_size={world_size}",
        f"num_envs={envs * world_size}",
        f"seed={args.seed}",
        "eval_freq=0",
        "eval_episodes=0",
        "checkpoint_freq=0",
        "progress=false",
        f"run_dir={run_dir}",
        f"env_kwargs.time_limit={limit}",
        f"log_freq={log_freq(args)}",
    ]
    cmd += [f"{ours}={_ddprl_value(value)}" for ours, _, value in SHARED]
    if args.weak_scaling:
        # Every rank does one process's work: 32 episodes per rank and an update every episode
        # limit of *its own* steps (N x 32 episodes per update): throughput scaling.
        cmd += [f"update_every={limit * world_size}"]
    else:
        # The same 32 episodes per update in total: DDP averages the ranks' gradients, so N ranks
        # take 32/N each (batch_size is per rank) and the updates cost what EPyMARL's do.
        cmd += [f"batch_size={32 // world_size}"]
    cmd += args.ddprl_extra
    if args.verbose:
        print("    $ " + shlex.join(cmd), flush=True)
    wall = run_logged(cmd, tmp / "ddprl.log", child_env(), REPO, args.timeout)
    rows = [r for r in read_metrics(run_dir) if "step" in r and "wall_time" in r]
    records = [(r["wall_time"], r["step"], r.get("train/updates", float("nan")), 0.0) for r in rows]
    result = window(records, args.skip_frac * args.steps)
    in_window = [r["time/global_fps"] for r in rows if r["step"] > result["window_from"] and "time/global_fps" in r]
    result["fps_self"] = sum(in_window) / len(in_window) if in_window else float("nan")
    final = [
        r["train/episode_return"] for r in rows if r["step"] >= 0.9 * result["steps"] and "train/episode_return" in r
    ]
    if not final:  # fewer rows than that: the last row that has a return
        final = [r["train/episode_return"] for r in rows if "train/episode_return" in r][-1:]
    result["return"] = sum(final) / len(final) if final else float("nan")
    result["learner_share"] = float("nan")
    result["wall"] = wall
    return result


# -- the report ----------------------------------------------------------------------------------


def versions(python: str) -> str:
    """torch / numpy / gymnasium / lbforaging / rware / pettingzoo versions seen by ``python``."""
    code = (
        "import importlib.metadata as m\n"
        "out = []\n"
        "for p in ('torch', 'numpy', 'gymnasium', 'lbforaging', 'rware', 'pettingzoo'):\n"
        "    try: out.append(f'{p} {m.version(p)}')\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(', '.join(out))"
    )
    try:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def epymarl_commit(tree: str) -> str:
    """The commit of the EPyMARL tree: its git HEAD, else a COMMIT file beside src/ (an exported tree)."""
    try:
        proc = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    except OSError:
        pass
    path = Path(tree) / "COMMIT"
    return path.read_text().split()[0] if path.exists() and path.read_text().strip() else "unknown"


def fmt(value: float, spec: str = ",.0f") -> str:
    return "-" if value != value else format(value, spec)  # nan -> "-"


def print_report(args: argparse.Namespace, rows: list[tuple[str, dict[str, Any]]]) -> None:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    key, limit = task_spec(args.task)
    print("\n### QMIX training speed: ddprl vs EPyMARL\n")
    print(
        f"Machine: {cpu_model()}, {os.cpu_count()} logical cores ({usable} usable), Python "
        f"{platform.python_version()}, OMP_NUM_THREADS=1 in every process  "
    )
    print(f"ddprl side: {versions(sys.executable)}  ")
    if not args.skip_epymarl:
        print(
            f"EPyMARL side: commit {epymarl_commit(args.epymarl)} ({args.epymarl}), "
            f"{versions(args.epymarl_python)}, sacred output {'off' if args.peer_no_sacred else 'on'}  "
        )
    print(
        f"Task: {args.task} (EPyMARL key {key}), episode limit {limit}; {args.steps:,} env steps, seed {args.seed}; "
        f"timed window: first record at >= {args.skip_frac:.0%} of the steps to the end (ddprl log_freq="
        f"{log_freq(args)}; EPyMARL: a record per runner call).  "
    )
    if args.repeats > 1:
        print(
            f"Rates, wall s: medians over {args.repeats} runs per row (env steps/s: min-max in brackets); "
            f"final return: their mean.  "
        )
    print(
        "Shared: " + ", ".join(f"{ours}={_ddprl_value(value)}" for ours, _, value in SHARED) + "; no evaluation, "
        "no checkpoints.\n"
    )
    base = dict(rows).get("EPyMARL episode runner (1 env)")
    if base is not None and "error" in base:
        base = None
    one_rank = {}
    for _name, r in rows:
        if "error" not in r and r.get("world_size") == 1:
            one_rank[r["envs"]] = r["fps"]
    print(
        "| row | env steps/s | updates/s | fps (self) | steps/s vs EPyMARL | updates/s vs EPyMARL "
        "| scaling eff. | final return | env steps | updates | wall s | other cores |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        if "error" in r:
            print(f"| {name} | failed | | | | | | | | | | |")
            continue
        vs = f"{r['fps'] / base['fps']:.2f}x" if base else "-"
        vs_u = f"{r['ups'] / base['ups']:.2f}x" if base and base["ups"] > 0 else "-"
        eff = "-"
        if r.get("world_size", 0) > 1 and r["envs"] in one_rank:
            eff = f"{r['fps'] / (r['world_size'] * one_rank[r['envs']]):.0%}"
        mark = "*" if r["other"] > args.max_other else ""
        fps = fmt(r["fps"])
        if len(r["fps_all"]) > 1:
            fps += f" ({min(r['fps_all']):,.0f}-{max(r['fps_all']):,.0f})"
        if r["failed_runs"]:
            fps += f" ({r['failed_runs']} run(s) failed)"
        print(
            f"| {name} | {fps} | {fmt(r['ups'], ',.1f')} | {fmt(r['fps_self'])} | {vs} | {vs_u} | {eff} "
            f"| {fmt(r['return'], '.3f')} | {r['steps']:,.0f} | {fmt(r['updates'], ',.0f')} | {r['wall']:.0f} "
            f"| {r['other']:.2f}{mark} |"
        )
    failed = [(name, r["error"]) for name, r in rows if "error" in r]
    for name, error in failed:
        print(f"\n{name} failed: {error.splitlines()[0] if error else ''}")
    if any(r.get("other", 0) > args.max_other for _, r in rows if "error" not in r):
        print(f"\n* other processes used more than {args.max_other} cores during that row: its rate is unreliable.")


def run_row(args: argparse.Namespace, name: str, job: Any, repeat: int) -> dict[str, Any]:
    """One run of a row, redone (up to --retries) while other processes crowd the machine."""
    result: dict[str, Any] = {}
    for attempt in range(args.retries + 1):
        print(f"[{name}] run {repeat + 1}/{args.repeats}: {args.steps:,} steps ...", flush=True)
        began = cpu_counters()
        with contextlib.ExitStack() as stack:
            if args.keep:
                slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
                tmp = Path(args.keep) / f"{slug}-{repeat}-{attempt}"
                tmp.mkdir(parents=True, exist_ok=True)
            else:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qmix-speed-")))
            try:
                run = job(tmp)
            except Exception as exc:  # a failed row is reported, the others still run
                run = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"[{name}] failed: {run['error']}", flush=True)
        if "error" in run:
            return result or run
        run["other"] = foreign_load(began, cpu_counters())
        print(
            f"[{name}] {run['fps']:,.0f} env steps/s, {run['ups']:,.1f} updates/s over "
            f"{run['window_steps']:,.0f} steps ({run['window_s']:.1f} s), {run['wall']:.0f} s in all, "
            f"final return {run['return']:.3f}, other processes {run['other']:.2f} cores"
            + (
                f", learner train() {run['learner_share']:.0%} of the training time"
                if run["learner_share"] == run["learner_share"]
                else ""
            )
            + (f", {run['fps_cpu']:,.0f} env steps per CPU-second" if "fps_cpu" in run else ""),
            flush=True,
        )
        if not result or run["other"] < result["other"]:
            result = run
        if run["other"] <= args.max_other:
            break
    return result


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A row's repeats: medians of the rates and wall time, mean return, the worst contention."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    row = dict(ok[0])
    for key in ("fps", "ups", "fps_self", "wall"):
        row[key] = statistics.median(r[key] for r in ok)
    row["return"] = statistics.fmean(r["return"] for r in ok)
    row["other"] = max(r["other"] for r in ok)
    row["fps_all"] = [r["fps"] for r in ok]
    row["failed_runs"] = len(runs) - len(ok)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="Foraging-8x8-2p-2f-coop-v3", choices=sorted(TASKS))
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per row (all envs, all ranks)")
    parser.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2], help="ddprl world sizes")
    parser.add_argument("--num-envs", type=int, nargs="*", default=[1, 8], help="ddprl envs per rank")
    parser.add_argument(
        "--peer-envs",
        type=int,
        nargs="*",
        default=[1],
        help="EPyMARL rows: 1 = episode runner, E > 1 = parallel runner with E envs",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every row, rotated in order (medians reported; one machine is noisy)",
    )
    parser.add_argument("--epymarl", default="/work/peers/epymarl", help="EPyMARL tree (holds src/main.py)")
    parser.add_argument(
        "--epymarl-python",
        default="/work/peers/epymarl-venv/bin/python",
        help="the Python of EPyMARL's virtual environment",
    )
    parser.add_argument("--skip-epymarl", action="store_true")
    parser.add_argument(
        "--weak-scaling",
        action="store_true",
        help="ddprl ranks each do one process's work (32 episodes per rank, an update per episode "
        "limit of local steps) instead of sharing EPyMARL's 32-episode update",
    )
    parser.add_argument("--skip-ddprl", action="store_true")
    parser.add_argument(
        "--peer-no-sacred", action="store_true", help="EPyMARL without sacred's file observer and stdout capture"
    )
    parser.add_argument(
        "--skip-frac",
        type=float,
        default=0.1,
        help="the timed window starts at the first record past this fraction of --steps",
    )
    parser.add_argument(
        "--ddprl-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more ddprl keys for every ddprl row"
    )
    parser.add_argument(
        "--log-freq",
        type=int,
        default=None,
        help="ddprl's log_freq (env steps between metric rows; default min(10000, steps/10))",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed per row (default: none)")
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.2,
        metavar="CORES",
        help="flag a row during which other processes used more CPU than this",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=1,
        help="redos of a row during which other processes used more than --max-other cores "
        "(the least contended run is kept)",
    )
    parser.add_argument("--report", metavar="FILE", help="also write the final table (markdown) to FILE")
    parser.add_argument(
        "--keep", metavar="DIR", help="keep every row's logs, probe JSON and ddprl run directory under DIR"
    )
    parser.add_argument("--verbose", action="store_true", help="print every row's command line")
    args = parser.parse_args()
    if not args.skip_epymarl:
        if not (Path(args.epymarl) / "src" / "main.py").exists():
            parser.error(f"no EPyMARL tree at {args.epymarl} (no src/main.py): pass --epymarl DIR or --skip-epymarl")
        if not Path(args.epymarl_python).exists():
            parser.error(f"no Python at {args.epymarl_python}: pass --epymarl-python PATH or --skip-epymarl")

    plan: list[tuple[str, Any]] = []
    if not args.skip_epymarl:
        for envs in args.peer_envs:
            name = "EPyMARL episode runner (1 env)" if envs == 1 else f"EPyMARL parallel runner ({envs} envs)"
            plan.append((name, lambda tmp, e=envs: {**run_epymarl(args, e, tmp), "envs": e}))
    if not args.skip_ddprl:
        for envs in args.num_envs:
            for n in args.world_sizes:
                plan.append(
                    (
                        f"ddprl {n} rank{'s' if n > 1 else ''} x {envs} env{'s' if envs > 1 else ''}",
                        lambda tmp, n=n, e=envs: {**run_ddprl(args, n, e, tmp), "world_size": n, "envs": e},
                    )
                )

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in plan}
    for repeat in range(args.repeats):
        order = plan[repeat % len(plan) :] + plan[: repeat % len(plan)]  # rotate: no row always first
        for name, job in order:
            runs[name].append(run_row(args, name, job, repeat))
    rows = [(name, combine(runs[name])) for name, _ in plan]

    emit_report(lambda: print_report(args, rows), args.report)


if __name__ == "__main__":
    main()
