"""Where a row's runs are kept and how they are read back: ``runs/<row>/seed<K>/`` (a gzipped
``metrics.jsonl`` and ``config.yaml``), ``summary.json`` beside them, a long row's seeds in progress
and lost attempts, the machine each seed ran on. ``RUNS``, ``WORK``, ``PAGE`` and ``IMAGES`` are read
at each call (``run.py --runs DIR`` and the tests point them elsewhere)."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from .rows import EVAL
from .stats import curve

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = HERE / "runs"
WORK = HERE / "work"  # long rows' runs in progress, between sittings (git-ignored): checkpoints, replay buffers
IN_PROGRESS = "in_progress"  # RUNS/<row>/in_progress/seed<K>: a long row's seed as its last sitting left it (kept)
LOST = "lost"  # RUNS/<row>/lost/seed<K>[-N]: a long row's seed whose checkpoint went with its machine: how far it got
SITTINGS = "sittings.json"  # a long row's run: each sitting's `ddprl train` (start-up included): wall time, machine
PAGE = ROOT / "docs" / "results.md"
IMAGES = ROOT / "docs" / "results"


def kept_summary(row: str) -> dict | None:
    path = RUNS / row / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def seed_curves(row: str, summary: dict, key: str = EVAL) -> list[list[tuple[int, float]]]:
    """Each kept seed's curve of ``key`` (the evaluation return), in the summary's order."""
    return [curve(read_rows(RUNS / row / f"seed{seed['seed']}"), key) for seed in summary["seeds"]]


def read_rows(run: Path) -> list[dict]:
    """The rows of a kept run's metrics (``metrics.jsonl.gz``, or ``metrics.jsonl`` as written)."""
    from ddprl.metrics import read_metrics

    return read_metrics(run)


def pack(keep: Path) -> None:
    """``keep/metrics.jsonl`` -> ``metrics.jsonl.gz`` (a fifth of the size; ``ddprl plot`` and
    ``read_metrics`` read either). The kept runs travel with every copy of the repository, the
    GPU machine's included, whose working tree is limited in size."""
    plain = keep / "metrics.jsonl"
    with plain.open("rb") as src, gzip.GzipFile(keep / "metrics.jsonl.gz", "wb", 9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def sittings(run: Path) -> list[dict]:
    """Each sitting of a long row's run so far (``SITTINGS``; none yet: []): its wall time
    (``wall_s``) and the machine it ran on (``machine``: None for the sittings kept before the
    machine was, as a bare number of seconds)."""
    path = run / SITTINGS
    kept = json.loads(path.read_text()) if path.exists() else []
    return [s if isinstance(s, dict) else {"wall_s": s, "machine": None} for s in kept]


def add_sitting(run: Path, wall: float) -> None:
    """Append a sitting of ``wall`` seconds on this machine to ``run``'s ``SITTINGS``."""
    entry = {"wall_s": round(wall, 1), "machine": this_machine()}
    (run / SITTINGS).write_text(json.dumps([*sittings(run), entry]) + "\n")


def sittings_wall(kept: list[dict]) -> float:
    """A run's training time so far: the sum of its sittings' (:func:`sittings`), in seconds."""
    return sum(s["wall_s"] for s in kept)


def hours_by_machine(kept: list[dict]) -> dict[str | None, float]:
    """The hours of a run's sittings (:func:`sittings`) on each machine, in the order first met
    (None: the sittings whose machine was not recorded)."""
    hours: dict[str | None, float] = {}
    for sitting in kept:
        hours[sitting["machine"]] = hours.get(sitting["machine"], 0.0) + sitting["wall_s"] / 3600
    return hours


def sittings_machine(kept: list[dict]) -> str:
    """The machine a long row's seed ran on, from its sittings: the one, or each with its hours
    ('A, 2 cores (9.1 h) + B, 2 cores (3.0 h)') when its sittings ran on several."""
    hours = hours_by_machine(kept)
    if len(hours) == 1 and None not in hours:
        return next(iter(hours))
    return " + ".join(f"{machine or 'machine not recorded'} ({h:.1f} h)" for machine, h in hours.items())


def keep_run(run_dir: Path, keep: Path, *more: str) -> None:
    """A run's metrics.jsonl (gzipped), config.yaml and the ``more`` files, copied to ``keep``
    (replacing what it held)."""
    keep.mkdir(parents=True, exist_ok=True)
    for file in ("metrics.jsonl", "config.yaml", *more):
        shutil.copy(run_dir / file, keep / file)
    pack(keep)


def in_progress(name: str, folder: str = IN_PROGRESS) -> list[dict]:
    """A long row's seeds stopped part-way, as each one's last sitting left it: its seed, last step,
    evaluations so far, training time so far (the sum of its sittings) and its hours on each machine
    (:func:`hours_by_machine`). ``folder=LOST``: the attempts set aside by :func:`set_aside_lost`
    instead."""
    seeds = []
    for keep in sorted((RUNS / name / folder).glob("seed*")):
        rows = read_rows(keep)
        kept = sittings(keep)
        seeds.append(
            {
                "seed": seed_of(keep.name),
                "step": rows[-1]["step"],
                "evals": curve(rows),
                "wall_s": sittings_wall(kept),
                "hours": hours_by_machine(kept),
            }
        )
    return seeds


def seed_of(name: str) -> int:
    """The seed a kept run's directory or its curve's label names: seed<K>, seed<K>-<N>, 'seed<K>, lost'."""
    return int(re.match(r"seed(\d+)", name)[1])


def set_aside_lost(out: Path, seed: int, work: Path) -> Path | None:
    """Move a long row's in-progress record of ``seed`` to ``out/LOST/`` when ``work`` holds no
    checkpoint to go on from (the work directory is not committed: a sitting on a new machine finds
    none). The seed then starts again, and its fresh record would otherwise overwrite how far the
    lost attempt got. Returns where the record went (None: nothing to set aside)."""
    progress = out / IN_PROGRESS / f"seed{seed}"
    if not progress.is_dir() or (work / "checkpoints" / "latest.pt").exists():
        return None
    lost = out / LOST / f"seed{seed}"
    attempt = 2
    while lost.exists():  # a seed lost twice keeps both
        lost, attempt = out / LOST / f"seed{seed}-{attempt}", attempt + 1
    lost.parent.mkdir(parents=True, exist_ok=True)
    progress.rename(lost)
    with contextlib.suppress(OSError):
        progress.parent.rmdir()  # once empty
    return lost


def kept_seeds(out: Path, name: str, command: str, seeds: int) -> list[dict]:
    """The seeds (up to ``seeds``) that ``out/summary.json`` holds and whose runs are kept; refuses
    a summary made by another command (a row whose keys changed since)."""
    if not (out / "summary.json").exists():
        return []
    done = json.loads((out / "summary.json").read_text())
    if done["command"] != command:
        raise SystemExit(f"{name}: the kept seeds ran `{done['command']}`, the row now runs `{command}`")
    kept = [s for s in done["seeds"] if s["seed"] <= seeds and (out / f"seed{s['seed']}").is_dir()]
    return [{**s, "machine": seed_machine(s, done)} for s in kept]  # the summary's machine is the last seed's


@functools.cache
def this_machine() -> str:
    """The CPU and its cores, after the GPU's name where ``nvidia-smi`` finds one (a GPU row's machine)."""
    from machine import cpu_model

    cpu = f"{cpu_model()}, {os.cpu_count()} cores"
    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):  # no driver here: a CPU machine
        return cpu
    return f"{gpus[0].strip()}, {cpu}" if gpus and gpus[0].strip() else cpu


def seed_machine(seed: dict, summary: dict) -> str:
    """The machine a kept seed ran on (summaries older than the per-seed entry name one for all)."""
    return seed.get("machine", summary["machine"])


def seed_summary(seed: int, wall: float, evals: list[tuple[int, float]], machine: str | None = None) -> dict:
    """What a row's summary keeps of one seed's evaluation curve; ``machine``: where it ran (a long
    row's seed: :func:`sittings_machine`), this machine if not given."""
    return {
        "seed": seed,
        "wall_s": wall,
        "final": evals[-1][1],
        "final_step": evals[-1][0],
        "best": max(r for _, r in evals),
        "machine": machine or this_machine(),
    }


def write_summary(out: Path, name: str, command: str, seeds: list[dict], **extra: object) -> None:
    summary = {
        "row": name,
        "command": command,
        **extra,
        "machine": this_machine(),
        "date": time.strftime("%Y-%m-%d"),
        "seeds": seeds,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
