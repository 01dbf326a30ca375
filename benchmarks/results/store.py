"""Where a row's runs are kept: ``runs/<row>/seed<K>/`` (gzipped ``metrics.jsonl``, ``config.yaml``) and
``summary.json`` beside them. The paths are read at each call (``run.py --runs DIR`` and the tests move them)."""

from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = HERE / "runs"
WORK = HERE / "work"  # long rows' runs between sittings (git-ignored): checkpoints, replay buffers
PAGE = ROOT / "docs" / "results.md"  # and results.csv beside it
IMAGES = ROOT / "docs" / "results"


def kept_summary(row: str) -> dict | None:
    path = RUNS / row / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def read_rows(run: Path) -> list[dict]:
    from ddprl.metrics import read_metrics  # metrics.jsonl.gz, or metrics.jsonl as written

    return read_metrics(run)


def seed_runs(name: str, prefix: str = "seed") -> list[tuple[int, list[dict]]]:
    """Each seed of a row's summary with its kept metrics (``prefix``: a peer row's ``<impl>-seed``)."""
    seeds = (kept_summary(name) or {"seeds": []})["seeds"]
    return [(s["seed"], read_rows(RUNS / name / f"{prefix}{s['seed']}")) for s in seeds]


def pack(keep: Path) -> None:
    """``metrics.jsonl`` -> ``metrics.jsonl.gz``: a fifth of the size, the same bytes each time (no mtime)."""
    with (keep / "metrics.jsonl").open("rb") as src, gzip.GzipFile(keep / "metrics.jsonl.gz", "wb", 9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    (keep / "metrics.jsonl").unlink()


@functools.cache
def this_machine() -> str:
    """The CPU and its cores, after the GPU's name where ``nvidia-smi`` finds one."""
    from harness import cpu_model

    cpu, query = f"{cpu_model()}, {os.cpu_count()} cores", ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    try:
        gpu = (subprocess.run(query, capture_output=True, text=True, timeout=60).stdout.splitlines() or [""])[0].strip()
    except (OSError, subprocess.SubprocessError):  # no driver: a CPU machine
        gpu = ""
    return f"{gpu}, {cpu}" if gpu else cpu


def seed_summary(seed: int, wall: float, evals: list[tuple[int, float]], machine: str | None = None) -> dict:
    (step, final), best, machine = evals[-1], max(r for _, r in evals), machine or this_machine()
    return dict(seed=seed, wall_s=wall, final=final, final_step=step, best=best, machine=machine)


def write_summary(out: Path, name: str, command: str, seeds: list[dict], **extra: object) -> None:
    summary = {"row": name, "command": command, **extra, "machine": this_machine(), "date": time.strftime("%Y-%m-%d")}
    (out / "summary.json").write_text(json.dumps({**summary, "seeds": seeds}, indent=1) + "\n")
