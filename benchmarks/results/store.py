"""Where a row's runs are kept: ``runs/<row>/seed<K>/`` (gzipped ``metrics.jsonl``, ``config.yaml``, and
``provenance.json``: the code, command and machine it came from) and ``summary.json`` beside them; and the numbers
read from their curves. The paths are read at each call (``run.py --runs DIR`` and the tests move them)."""

from __future__ import annotations

import functools
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from ddprl.metrics import read_metrics as read_rows  # metrics.jsonl.gz, or metrics.jsonl as written

from .rows import EVAL

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = HERE / "runs"
WORK = HERE / "work"  # long rows' runs between sittings (git-ignored): checkpoints, replay buffers
PAGE = ROOT / "docs" / "results.md"  # and results.csv beside it
IMAGES = ROOT / "docs" / "results"
# the code a run depends on, for its provenance's `dirty`: the kept runs themselves are data, rewritten as rows run
CODE = ("ddprl", "benchmarks", ":(exclude)benchmarks/results/runs")
PROVENANCE = "provenance.json"


def kept_summary(row: str) -> dict | None:
    path = RUNS / row / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


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


def code_state() -> dict:
    """ddprl's commit and whether its code had uncommitted changes to tracked files: taken as a run starts, since
    the tree may change while it trains (None for both outside a git checkout)."""
    git = lambda *args: subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)  # noqa: E731
    head, diff = git("rev-parse", "HEAD").stdout.strip(), git("diff", "--quiet", "HEAD", "--", *CODE).returncode
    return {"commit": head or None, "dirty": {0: False, 1: True}.get(diff) if head else None}


def write_provenance(keep: Path, command: str, origin: dict | None = None, **extra: object) -> None:
    """``keep/provenance.json``: the code (``origin``, :func:`code_state` at the run's start), the command line as
    run, the machine and the versions a kept run came from; ``extra`` adds or replaces fields (a peer library's
    commit, its environment's versions)."""
    import torch  # the interpreter that runs `python -m ddprl train`: this one

    record = {**(origin or code_state()), "command": command, "machine": this_machine(), "torch": torch.__version__}
    record |= {"python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "recorded": "at the run"}
    (keep / PROVENANCE).write_text(json.dumps({**record, **extra}, indent=1) + "\n")


def provenance_of(name: str, prefix: str, seed: int | str) -> dict:
    """Commit, library commit (peer libraries), machine, torch, date and how they were recorded of a kept run
    (``prefix``: ``seed``, a peer row's ``<impl>-seed``, ``in_progress/seed``); None where not recorded."""
    path = RUNS / name / f"{prefix}{seed}" / PROVENANCE
    record = json.loads(path.read_text()) if path.exists() else {}
    return {key: record.get(key) for key in ("commit", "library_commit", "machine", "torch", "date", "recorded")}


def seed_summary(seed: int, wall: float, evals: list[tuple[int, float]], machine: str | None = None) -> dict:
    (step, final), best, machine = evals[-1], max(r for _, r in evals), machine or this_machine()
    return dict(seed=seed, wall_s=wall, final=final, final_step=step, best=best, machine=machine)


def write_summary(out: Path, name: str, command: str, seeds: list[dict], **extra: object) -> None:
    summary = {"row": name, "command": command, **extra, "machine": this_machine(), "date": time.strftime("%Y-%m-%d")}
    (out / "summary.json").write_text(json.dumps({**summary, "seeds": seeds}, indent=1) + "\n")


def curve(rows: list[dict], key: str = EVAL) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def at_steps(points: list[tuple[int, float]], steps: int) -> float | None:
    """The last value at or before ``steps`` (a budget rounds up to whole iterations: 2.5 % past counts)."""
    done = [value for step, value in points if step <= steps * 1.025]
    return done[-1] if done else None


def window_mean(points: list[tuple[int, float]], steps: int) -> float | None:
    """The mean over the last 5 % of ``steps`` (one iteration's training return is too noisy alone)."""
    window = [value for step, value in points if steps * 0.95 < step <= steps * 1.025]
    return statistics.mean(window) if window else None


def mean_std(values: list[float], digits: int) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f} (1 seed)" if values else "not run"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def welch(a: list[float], b: list[float]) -> float:
    """Welch's t-test of two means: the chance that seeds alone part them this far."""
    from scipy.stats import ttest_ind

    return float(ttest_ind(a, b, equal_var=False).pvalue)
