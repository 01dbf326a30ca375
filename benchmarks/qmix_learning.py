"""QMIX learning curves: ddprl vs EPyMARL run on this machine, at equal env steps.

    python benchmarks/qmix_learning.py [--task Foraging-8x8-2p-2f-coop-v3 | rware-tiny-2ag-v2 | simple_spread_v3]
        [--steps 200000] [--eval-freq 50000] [--eval-episodes 100] [--seed 1] [--skip-epymarl]
        [--epymarl /work/peers/epymarl] [--epymarl-python /work/peers/epymarl-venv/bin/python]

Protocol (EPyMARL's, shortened): greedy evaluation (epsilon 0) of --eval-episodes episodes
every --eval-freq env steps; the return is the team return (the agents' rewards summed).
Rows, one after the other (subprocesses; EPyMARL from its own tree and venv through
``epymarl_probe.py``, see ``qmix_speed.py``):

    EPyMARL             its QMIX defaults (1 env, one update per episode), test_nepisode and
                        test_interval set to the protocol
    ddprl EPyMARL-like  the same hyperparameters, 1 rank x 8 envs, raw mixer states and
                        time-outs treated as terminal (standardise_state=false
                        bootstrap_truncated=false): EPyMARL's targets
    ddprl defaults      ddprl's QMIX defaults (standardised mixer states, truncation
                        bootstrapped), 2 ranks x 4 envs, batch 32 episodes per rank

Each row prints its evaluations as they come; the table at the end has the return at every
evaluation step and the wall-clock seconds of the whole run (evaluations included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_model  # noqa: E402
from qmix_speed import (  # noqa: E402
    PROBE,
    REPO,
    SHARED,
    _ddprl_value,
    child_env,
    epymarl_commit,
    run_logged,
    task_spec,
)

from ddprl.metrics import read_metrics  # noqa: E402


def epymarl_command(args: argparse.Namespace) -> list[str]:
    """EPyMARL's QMIX defaults on ``args.task`` through the probe: ``args.steps`` env steps, a
    greedy test of ``args.eval_episodes`` episodes every ``args.eval_freq``."""
    key, limit = task_spec(args.task)
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
        f"test_nepisode={args.eval_episodes}",
        f"test_interval={args.eval_freq}",
        f"log_interval={args.eval_freq}",
    ]
    return cmd + [f"{peer}={value}" for _, peer, value in SHARED]


def epymarl_tests(sacred_dir: Path) -> dict[int, float]:
    """``{t_env: mean return}`` of every greedy test of the run, from its sacred ``info.json``.
    Not from its console: PyMARL's ``print_recent_stats`` prints the mean of the last 5 logged
    values of each stat, so its ``test_return_mean`` lags (a moving average of 5 tests)."""
    infos = list(sacred_dir.rglob("info.json"))
    if len(infos) != 1:
        raise RuntimeError(f"expected one sacred info.json under {sacred_dir}, found {len(infos)}")
    info = json.loads(infos[0].read_text())

    def number(value: Any) -> float:  # sacred stores numpy floats jsonpickled: {"py/object": ..., "value": x}
        return float(value["value"] if isinstance(value, dict) else value)

    steps, returns = info.get("test_return_mean_T", []), info.get("test_return_mean", [])
    return {int(t): number(v) for t, v in zip(steps, returns, strict=True)}


def grid_step(step: int, every: int) -> int:
    """EPyMARL tests at the first ``t_env`` past each interval and counts the next one from there,
    so its test steps drift by up to an episode per test: the nearest multiple of ``every`` (the
    drift stays under half an interval over 2M steps, even for RWARE's 500-step episodes)."""
    return round(step / every) * every


def on_grid(curve: dict[int, float], every: int) -> dict[int, float]:
    """``curve`` with each step set on the nearest multiple of ``every`` (``grid_step``)."""
    return {grid_step(step, every): value for step, value in curve.items()}


def run_epymarl(args: argparse.Namespace, tmp: Path) -> tuple[dict[int, float], float]:
    """Run EPyMARL (``epymarl_command``); its tests by ``t_env`` and its wall seconds."""
    env = child_env()
    env["EPYMARL_PROBE_OUT"] = str(tmp / "probe.json")
    env["EPYMARL_PROBE_SACRED_DIR"] = str(tmp / "sacred")  # kept until ``tmp`` goes: the tests are read there
    wall = run_logged(epymarl_command(args), tmp / "epymarl.log", env, Path(args.epymarl), None)
    return epymarl_tests(tmp / "sacred"), wall


def run_ddprl(
    args: argparse.Namespace, tmp: Path, world_size: int, num_envs: int, extra: list[str], epymarl_settings: bool
) -> tuple[dict[int, float], float]:
    _, limit = task_spec(args.task)
    cmd = [
        sys.executable,
        "-m",
        "ddprl",
        "train",
        "algo=qmix",
        f"task={args.task}",
        f"steps={args.steps}",
        f"world_size={world_size}",
        f"num_envs={num_envs}",
        f"seed={args.seed}",
        f"eval_freq={args.eval_freq}",
        f"eval_episodes={args.eval_episodes}",
        "checkpoint_freq=0",
        "progress=false",
        f"run_dir={tmp}/run",
        f"env_kwargs.time_limit={limit}",
        f"log_freq={args.eval_freq}",
    ]
    if epymarl_settings:
        cmd += [f"{ours}={_ddprl_value(value)}" for ours, _, value in SHARED]
    cmd += extra
    wall = run_logged(cmd, tmp / "ddprl.log", child_env(), REPO, None)
    curve = {int(r["step"]): r["eval/return_mean"] for r in read_metrics(tmp / "run") if "eval/return_mean" in r}
    return curve, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="Foraging-8x8-2p-2f-coop-v3", help="an LBF, RWARE or MPE task")
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--eval-freq", type=int, default=50_000)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-epymarl", action="store_true")
    parser.add_argument("--epymarl", default="/work/peers/epymarl")
    parser.add_argument("--epymarl-python", default="/work/peers/epymarl-venv/bin/python")
    args = parser.parse_args()

    rows: list[tuple[str, dict[int, float], float]] = []
    runs: list[tuple[str, Any]] = []
    if not args.skip_epymarl:
        runs.append(("EPyMARL (1 env)", lambda tmp: run_epymarl(args, tmp)))
    runs.append(
        (
            "ddprl EPyMARL-like, 1 rank x 8 envs",
            lambda tmp: run_ddprl(
                args, tmp, 1, 8, ["standardise_state=false", "bootstrap_truncated=false"], epymarl_settings=True
            ),
        )
    )
    runs.append(
        ("ddprl defaults, 2 ranks x 4 envs", lambda tmp: run_ddprl(args, tmp, 2, 8, [], epymarl_settings=False))
    )
    for name, run in runs:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                curve, wall = run(Path(tmp))
            except RuntimeError as e:
                print(f"{name}: failed: {e}", flush=True)
                continue
        print(f"{name}: {curve} ({wall:.0f} s)", flush=True)
        rows.append((name, curve, wall))

    checkpoints = list(range(args.eval_freq, args.steps + 1, args.eval_freq))
    print(f"\n### QMIX greedy return on {args.task} ({args.eval_episodes} episodes per evaluation)\n")
    print(f"Machine: {cpu_model()}, {os.cpu_count()} cores; seed {args.seed}; EPyMARL {epymarl_commit(args.epymarl)}\n")
    print("| row | " + " | ".join(f"{s // 1000}k" for s in checkpoints) + " | wall s |")
    print("|---|" + "---|" * (len(checkpoints) + 1))
    for name, curve, wall in rows:
        grid = on_grid(curve, args.eval_freq)
        cells = [f"{grid[s]:.2f}" if s in grid else "-" for s in checkpoints]
        print(f"| {name} | " + " | ".join(cells) + f" | {wall:.0f} |")


if __name__ == "__main__":
    main()
