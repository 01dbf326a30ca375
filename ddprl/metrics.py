"""Rank-aware metrics: every rank calls ``log``; rank 0 alone writes (docs/distributed.md, invariant 6).

Sinks: ``metrics.jsonl`` (one JSON object per line), TensorBoard under ``tb/``, W&B when
enabled, and a tqdm progress bar on rank 0. Values handed to ``log`` must already be global
(reduced over ranks) unless their key starts with ``rank<r>/`` (invariant 7).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddprl.config import to_dict


class MetricsLogger:
    """Write metrics from rank 0; a no-op on the other ranks.

    >>> logger = MetricsLogger(run_dir, cfg, is_main=rt.is_main, total_steps=cfg.steps)  # doctest: +SKIP
    >>> logger.log(step=4096, metrics={"train/loss": 0.3, "time/global_fps": 9000.0})      # doctest: +SKIP
    """

    def __init__(
        self, run_dir: Path, cfg: Any, is_main: bool, total_steps: int, start_step: int = 0, resumed: bool = False
    ):
        self.is_main = is_main
        self.run_dir = Path(run_dir)
        self.start_time = time.time()
        self._tb = None
        self._wandb = None
        self._bar = None
        self._last_eval: float | None = None
        if not is_main:
            return
        if resumed:
            # wall_time goes on from the last row kept, so that it only grows over the sittings of
            # a job (the time between that row and the stop, and the restart, are not counted)
            self.start_time -= _drop_rows_after(self.run_dir / "metrics.jsonl", start_step)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the earlier events at steps >= it (the abandoned future).
        self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=start_step + 1 if resumed else None)
        if cfg.enable_wandb:
            self._wandb = _start_wandb(cfg, self.run_dir)
        if cfg.progress:
            from tqdm import tqdm

            self._desc = cfg.run_name()
            self._bar = tqdm(
                total=total_steps, initial=start_step, unit="step", unit_scale=True, dynamic_ncols=True, desc=self._desc
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at global step ``step`` (every rank calls; rank 0 writes)."""
        if not self.is_main:
            return
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        record = {"step": int(step), "wall_time": time.time() - self.start_time, **clean}
        self._jsonl.write(json.dumps(record) + "\n")
        for k, v in clean.items():
            self._tb.add_scalar(k, v, int(step))
        if self._wandb is not None:
            self._wandb.log(clean, step=int(step))
        if "eval/return_mean" in clean:
            self._last_eval = clean["eval/return_mean"]

    def progress(self, step: int, rate: float | None = None, label: str = "fps") -> None:
        """Move the progress bar to global ``step``, showing ``rate`` as ``label`` (rank 0 only)."""
        if self._bar is None:
            return
        self._bar.update(max(0, int(step) - self._bar.n))
        post = {}
        if rate is not None:
            post[label] = f"{rate:,.0f}"
        if self._last_eval is not None:
            post["eval"] = f"{self._last_eval:.1f}"
        self._bar.set_postfix(post, refresh=False)

    def evaluating(self, done: int, episodes: int) -> None:
        """Show an evaluation's progress on the bar (rank 0's share of the episodes)."""
        if self._bar is None:
            return
        desc = self._desc if done >= episodes else f"{self._desc} | evaluating: episode {done + 1}/{episodes}"
        self._bar.set_description(desc, refresh=True)

    def close(self) -> None:
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.close()
        self._tb.flush()
        self._tb.close()
        self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(cfg: Any, run_dir: Path):
    try:
        import wandb
    except ImportError:
        from ddprl.errors import UsageError

        raise UsageError("enable_wandb=true needs the wandb package: pip install 'ddprl[wandb]'") from None
    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=cfg.wandb_project,
        entity=cfg.wandb_entity or None,
        name=run_dir.name,
        dir=str(run_dir),
        mode=cfg.wandb_mode,
        config=to_dict(cfg),
        resume="allow",
        # One id per run directory: a resumed run continues its W&B run; two directories with
        # the same name elsewhere never collide.
        id=f"{run_dir.name}-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]}",
    )


def _drop_rows_after(path: Path, step: int) -> float:
    """Keep the rows of ``path`` up to global ``step`` (atomically rewritten; no file: nothing to
    do); returns the last kept row's ``wall_time`` (0 when none)."""
    if not path.exists():
        return 0.0
    kept, wall_time = [], 0.0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            if row["step"] <= step:
                kept.append(line + "\n")
                wall_time = float(row.get("wall_time", wall_time))
        except (ValueError, KeyError, TypeError):  # a line cut short by a killed job
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)
    return wall_time


def metrics_path(run_dir: str | Path) -> Path:
    """A run's metrics file: ``metrics.jsonl``, or ``metrics.jsonl.gz`` where a finished run was
    kept compressed (the results page's runs are) and the plain file is absent."""
    plain = Path(run_dir) / "metrics.jsonl"
    packed = plain.with_name(plain.name + ".gz")
    return packed if not plain.is_file() and packed.is_file() else plain


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` or ``metrics.jsonl.gz`` (for tests, plots and benchmarks)."""
    path = metrics_path(run_dir)
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
