"""What the stop-signal checks cost: real jobs, each reporting its own checks at the end.

Every ddprl job checks at its step boundaries whether a SIGTERM/SIGUSR1 reached some rank; about
once a second that is one small collective. Every metrics row carries ``time/stop_check_s``:
the time rank 0 has spent in those collectives so far, waiting for slower ranks included (an
upper bound of their cost). This script runs a few jobs with 2 ranks on this machine and
tabulates the last row's value against the run's wall time.

    python benchmarks/preemption_cost.py                 # PPO CartPole, QMIX LBF, supervised digits
    python benchmarks/preemption_cost.py --out docs-row.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from machine import cpu_counters, cpu_model, emit_report, foreign_load

from ddprl.metrics import read_metrics

JOBS = {
    "PPO CartPole-v1, 2 ranks, 300k steps": ["world_size=2", "steps=300000", "eval_episodes=0"],
    "QMIX Foraging-8x8-2p-2f-coop-v3, 2 ranks, 20k steps": [
        "algo=qmix",
        "task=Foraging-8x8-2p-2f-coop-v3",
        "world_size=2",
        "steps=20000",
        "eval_episodes=0",
    ],
    "supervised digits, 2 ranks, 60 epochs": [
        "algo=supervised",
        "task=digits",
        "world_size=2",
        "epochs=60",
        "patience=0",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="also write the report to this file")
    args = parser.parse_args()
    rows = []
    before = cpu_counters()
    for name, keys in JOBS.items():
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, MUJOCO_GL="disable")
            res = subprocess.run(
                [sys.executable, "-m", "ddprl", "train", *keys, "device=cpu", "progress=false", f"run_dir={tmp}/run"],
                capture_output=True,
                text=True,
                env=env,
                timeout=3600,
            )
            last = read_metrics(f"{tmp}/run")[-1] if res.returncode == 0 else {}
        if "time/stop_check_s" not in last:
            rows.append(f"| {name} | failed (exit {res.returncode}) | | |")
            continue
        spent, wall = last["time/stop_check_s"], last["wall_time"]
        rows.append(f"| {name} | {wall:.0f} s | {spent * 1e3:.1f} ms | {100 * spent / wall:.3f} % |")
    load = foreign_load(before, cpu_counters())

    def print_report() -> None:
        print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, other processes' load {load:.2f} cores; 2 ranks (gloo)\n")
        print("| job | run time | time in the checks | share of the run |")
        print("|---|---|---|---|")
        for row in rows:
            print(row)

    emit_report(print_report, args.out)


if __name__ == "__main__":
    main()
