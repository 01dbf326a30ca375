"""The run directory (DESIGN.md "Run directory") and the checkpoints inside it.

    <run_dir>/config.yaml  metrics.jsonl  tb/  checkpoints/step_<N>.pt  checkpoints/latest.pt

Rank 0 names and creates the directory and broadcasts its path: one directory per job.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ddprl.checkpoint import load_checkpoint, save_checkpoint
from ddprl.config import save_yaml
from ddprl.errors import UsageError

log = logging.getLogger("ddprl")


def default_run_dir(cfg: Any) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    task = cfg.task.replace("/", "_")
    path = Path("runs") / f"{cfg.algo}-{task}-{stamp}"
    suffix = 1
    while path.exists():  # two jobs started in the same second
        path = Path("runs") / f"{cfg.algo}-{task}-{stamp}-{suffix}"
        suffix += 1
    return path


def open_run_dir(rt: Any, cfg: Any) -> Path:
    """Collective: rank 0 creates the run directory and writes config.yaml; all get its path."""
    path = None
    if rt.is_main:
        path = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
        (path / "checkpoints").mkdir(parents=True, exist_ok=True)
        save_yaml(cfg, path / "config.yaml")
        path = str(path.resolve())
    return Path(rt.broadcast_object(path))


def resolve_resume(resume: str, run_dir: str, algo: str) -> Path | None:
    """The checkpoint to resume from, checked before any process starts (None: fresh start).

    ``resume=auto`` takes ``<run_dir>/checkpoints/latest.pt`` when it exists and starts fresh
    otherwise (so a requeued SLURM job just re-runs the same command).
    """
    if not resume:
        return None
    if resume == "auto":
        if not run_dir:
            raise UsageError("resume=auto needs run_dir=<the run's directory>")
        latest = Path(run_dir) / "checkpoints" / "latest.pt"
        if not latest.exists():
            log.info("resume=auto: no %s yet, starting fresh", latest)
            return None
        path = latest
    else:
        path = Path(resume)
    load_checkpoint(path, expect_algo=algo)  # raises a UsageError for missing/truncated/foreign files
    return path.resolve()


def run_dir_of_checkpoint(path: Path) -> Path:
    """``runs/X/checkpoints/step_N.pt`` → ``runs/X``."""
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


class Checkpointer:
    """Writes ``checkpoints/step_<N>.pt`` and points ``latest.pt`` at it (collective ``save``)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir) / "checkpoints"

    def save(self, rt: Any, step: int, payload: dict[str, Any], rank_state: dict[str, Any]) -> Path:
        path = self.dir / f"step_{step}.pt"
        save_checkpoint(rt, path, payload, rank_state)
        if rt.is_main:
            tmp = self.dir / "latest.pt.tmp"
            tmp.unlink(missing_ok=True)
            try:
                os.link(path, tmp)  # same bytes, no second write
            except OSError:
                shutil.copyfile(path, tmp)
            os.replace(tmp, self.dir / "latest.pt")
        return path
