"""PPO's Atari preset at ``precision=fp32`` against ``bf16``: the first --steps of 10M-step runs (the learning rate
annealed over 10M, as the results page's seeds), 2 CPU ranks with cpu_bind=cores, seeds 1..--seeds each way: whether
bf16 learns as fp32 does (its speed: roofline.py, atari_throughput.py). A run stops at --steps with a checkpoint; one
stopped sooner (a sitting's end: SIGTERM to this script) goes on from it with --resume, on any machine: its state is
kept under precision/ to commit, as the results' long rows keep theirs, and removed once the run reaches --steps. A
seed that the results page's CPU row of the game has trained that far at the same precision is read from there.

    python benchmarks/precision_curves.py [--task Pong-v5] [--steps 2000000] [--seeds 2] [--resume]
    python benchmarks/precision_curves.py --report [--task Pong-v5] [--steps 2000000] [--seeds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: results, harness.py

from results import store, training  # noqa: E402 (the path above first)
from results.rows import ROWS, TRAIN  # noqa: E402

HERE = Path(__file__).resolve().parent / "precision"
RUNS, WORK = HERE / "runs", HERE / "work"  # kept records (committed); the runs' directories (git-ignored)
PRECISIONS = ("fp32", "bf16")
BINS = 8  # the curve's table: the mean training return in this many equal spans of --steps
POLL_S = 10.0  # how often a run's metrics are read for its step


def results_row(task: str) -> str:
    return f"ppo-atari-{task.removesuffix('-v5').lower()}-cpu"


def keys_of(task: str, precision: str) -> list[str]:
    """The results row's command (2 CPU ranks, 10M steps) at ``precision``."""
    return [*ROWS[results_row(task)].keys, f"precision={precision}"]


def row_trains_at(task: str, precision: str) -> bool:
    """Whether the results row's own command trains at ``precision`` (not ``auto``, which depends on the machine)."""
    from ddprl.config import load_config

    return load_config(list(ROWS[results_row(task)].keys)).precision == precision


def kept_dirs(task: str, precision: str, seed: int) -> list[Path]:
    """Where a seed's record may be, first found first: this script's, then the results row's where that
    row trains at ``precision``."""
    mine = RUNS / f"{task}-{precision}"
    dirs = [mine / f"seed{seed}", mine / training.IN_PROGRESS / f"seed{seed}"]
    if row_trains_at(task, precision):
        theirs = store.RUNS / results_row(task)
        dirs += [theirs / f"seed{seed}", theirs / training.IN_PROGRESS / f"seed{seed}"]
    return [d for d in dirs if (d / "metrics.jsonl.gz").exists()]


def trained(task: str, precision: str, seed: int) -> list[dict]:
    """The seed's metric rows from its furthest record (none: [])."""
    found = [store.read_rows(d) for d in kept_dirs(task, precision, seed)]
    return max(found, key=lambda rows: rows[-1]["step"] if rows else 0, default=[])


def stop_at(steps: int, metrics: Path, done: threading.Event) -> None:
    """SIGTERM to the run once its metrics pass ``steps`` (it checkpoints and exits 75)."""
    while not done.wait(POLL_S):
        if metrics.exists() and (rows := store.read_rows(metrics.parent)) and rows[-1]["step"] >= steps:
            for proc in list(training.LIVE_RUNS):
                proc.terminate()
            return


def train(task: str, precision: str, seed: int, steps: int, resume: bool) -> None:
    """One run to ``steps`` (or until stopped), its record kept in RUNS; the state goes once it got there."""
    if (rows := trained(task, precision, seed)) and rows[-1]["step"] >= steps:
        print(f"{task} {precision} seed {seed}: trained to {rows[-1]['step']:,} steps, kept", flush=True)
        return
    out, what = RUNS / f"{task}-{precision}", f"{task} {precision} seed {seed}"
    work = WORK / out.name / f"seed{seed}"
    if not resume:
        for path in (work, out / training.IN_PROGRESS / f"seed{seed}"):
            shutil.rmtree(path, ignore_errors=True)
    elif training.restore_state(out, seed, work):
        print(f"{what}: goes on from its kept checkpoint", flush=True)
    done = threading.Event()
    watcher = threading.Thread(target=stop_at, args=(steps, work / "metrics.jsonl", done), daemon=True)
    watcher.start()
    try:
        training.train_and_keep(keys_of(task, precision), seed, out / f"seed{seed}", what, work=work)
    except training.Stopped as stopped:
        progress = out / training.IN_PROGRESS / f"seed{seed}"
        if store.read_rows(progress)[-1]["step"] < steps:  # stopped by a signal to this script
            print(stopped, flush=True)
            raise SystemExit(75) from None
        (progress / training.STATE).unlink(missing_ok=True)  # got there: nothing left to go on from
        print(f"{what}: trained to {steps:,} steps", flush=True)
    finally:
        done.set()


def window(rows: list[dict], start: float, end: float) -> float | None:
    values = [v for s, v in store.curve(rows, TRAIN) if start < s <= end]
    return statistics.mean(values) if values else None


def report(task: str, steps: int, seeds: int) -> None:
    runs = {(p, s): trained(task, p, s) for p in PRECISIONS for s in range(1, seeds + 1)}
    runs = {k: [r for r in rows if r["step"] <= steps * 1.01] for k, rows in runs.items() if rows}
    print(
        f"{task}, PPO's Atari preset (2 CPU ranks, 10M-step schedule), training return over its first {steps:,} steps"
    )
    span = steps / BINS
    head = ["precision", "seed", "steps", *(f"<= {span * (b + 1) / 1e6:.2f}M" for b in range(BINS))]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    last: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for (precision, seed), rows in runs.items():
        cells = [window(rows, span * b, span * (b + 1)) for b in range(BINS)]
        if rows[-1]["step"] >= steps and cells[-1] is not None:
            last[precision].append(cells[-1])
        shown = ["-" if c is None else f"{c:.1f}" for c in cells]
        print(f"| {precision} | {seed} | {rows[-1]['step']:,} | " + " | ".join(shown) + " |")
    a, b = last["fp32"], last["bf16"]
    print(f"\nLast span, runs that reached {steps:,} steps: fp32 {store.mean_std(a, 1)}, bf16 {store.mean_std(b, 1)}")
    if len(a) >= 2 and len(b) >= 2:
        print(f"bf16 - fp32: {statistics.mean(b) - statistics.mean(a):+.2f}; Welch's p = {store.welch(a, b):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="Pong-v5", help="an Atari game with a results row on the CPU")
    parser.add_argument("--steps", type=int, default=2_000_000)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--only", default=",".join(PRECISIONS), help="fp32, bf16 or both")
    parser.add_argument("--resume", action="store_true", help="go on from the kept checkpoints")
    parser.add_argument("--report", action="store_true", help="the curves' table from the kept records")
    args = parser.parse_args()
    if results_row(args.task) not in ROWS:
        cpu = sorted(n for n in ROWS if n.startswith("ppo-atari-") and n.endswith("-cpu"))
        raise SystemExit(f"--task {args.task}: no results row {results_row(args.task)}; the CPU rows: {', '.join(cpu)}")
    if not args.report:
        training.pass_on_stop_signals()
        for seed in range(1, args.seeds + 1):
            for precision in [p for p in PRECISIONS if p in args.only.split(",")]:
                if training.STOPPING.is_set():
                    raise SystemExit(75)
                train(args.task, precision, seed, args.steps, args.resume)
    report(args.task, args.steps, args.seeds)


if __name__ == "__main__":
    main()
