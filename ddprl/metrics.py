"""Rank-aware metrics: every rank calls ``log``; rank 0 alone writes (docs/distributed.md, invariant 6).

Sinks: ``metrics.jsonl`` (one JSON object per line), TensorBoard under ``tb/``, W&B when
enabled, and a tqdm progress bar on rank 0. Values handed to ``log`` must already be global
(reduced over ranks) unless their key starts with ``rank<r>/`` (invariant 7).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ddprl.config import JobConfig, to_dict
from ddprl.errors import DiskFull
from ddprl.files import AppendFile, disk_full, is_disk_full, write_atomically


class MetricsLogger:
    """Write metrics from rank 0; a no-op on the other ranks.

    >>> logger = MetricsLogger(run_dir, cfg, is_main=rt.is_main, total_steps=cfg.steps)  # doctest: +SKIP
    >>> logger.log(step=4096, metrics={"train/loss": 0.3, "time/global_fps": 9000.0})      # doctest: +SKIP
    """

    def __init__(
        self, run_dir: Path, cfg: JobConfig, is_main: bool, total_steps: int, start_step: int = 0, resumed: bool = False
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
        self._jsonl = AppendFile(self.run_dir / "metrics.jsonl")
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the earlier events at steps >= it (the abandoned future).
        purge_step = start_step + 1 if resumed else None
        if resumed:
            _after_event_files(self.run_dir / "tb")
        try:
            with self._tb_writes():
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge_step)
        except BaseException:
            self._jsonl.close()
            raise
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
        self._jsonl.append((json.dumps(record) + "\n").encode())
        if self._tb is not None:
            with self._tb_writes():
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
        """Flush and close every sink; a full disk met on the way raises :class:`DiskFull` once
        all of them are closed."""
        if not self.is_main:
            return
        self.is_main = False  # closed: a second close (after a failure) has nothing to do
        if self._bar is not None:
            self._bar.close()
        self._jsonl.close()
        try:
            if self._tb is not None:
                with self._tb_writes():
                    self._tb.flush()
        finally:
            self._close_tb()
            if self._wandb is not None:
                self._wandb.finish()

    def abandon(self) -> None:
        """Close every sink, quietly: the job is leaving after a write that did not fit."""
        try:
            self.close()
        except DiskFull:
            pass

    @contextlib.contextmanager
    def _tb_writes(self) -> Iterator[None]:
        """TensorBoard writes events from a thread of its own and raises a failed write at a later
        call: a full disk there becomes a :class:`DiskFull` naming the events file."""
        try:
            yield
        except OSError as e:
            if not is_disk_full(e):
                raise
            path = self._tb_file()
            self._close_tb()  # its writer thread has stopped: nothing more goes through it
            raise disk_full(path, None, e) from None

    def _tb_file(self) -> Path:
        writer = getattr(self._tb, "file_writer", None)
        name = getattr(getattr(writer, "event_writer", None), "_file_name", None)  # not public: the folder else
        return Path(name) if name else self.run_dir / "tb"

    def _close_tb(self) -> None:
        tb, self._tb = self._tb, None
        if tb is not None:
            try:
                tb.close()
            except OSError as e:  # what it could not write is lost either way; the first error was raised
                if not is_disk_full(e):
                    raise


def _quiet_tb_disk_full(args: threading.ExceptHookArgs) -> None:
    """TensorBoard's writer thread ends on a full disk printing a traceback, and raises the same
    error again at the logger's next call, which says it in one line: keep the thread quiet."""
    if type(args.thread).__name__ == "_AsyncWriterThread" and is_disk_full(args.exc_value):
        return
    _excepthook(args)


_excepthook = threading.excepthook
threading.excepthook = _quiet_tb_disk_full


def _start_wandb(cfg: JobConfig, run_dir: Path) -> Any:
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


# Longest wait for the clock to pass the newest event file's second: a file stamped further ahead
# was made by another machine's clock, ahead of this one, which no short wait brings level.
MAX_EVENT_FILE_WAIT_S = 2.0


def _after_event_files(tb_dir: Path) -> None:
    """Return once the clock is past the second of every event file in ``tb_dir``.

    TensorBoard reads event files in the order of their names, and a purge_step hides only the
    events read before it. A name is ``events.out.tfevents.<second>.<host>.<pid>.<n>``: files of
    one second sort as text by host, pid and ``n`` (``.10`` before ``.9``), not by creation, while
    a later second sorts after them all. TensorBoard makes the name, so the resumed writer starts
    in a later second (a wait only where a file is of this second).
    """
    seconds = [
        int(part) for path in tb_dir.glob("events.out.tfevents.*") if (part := path.name.split(".")[3]).isdigit()
    ]
    if not seconds:
        return
    newest = max(seconds)
    if newest + 1 - time.time() > MAX_EVENT_FILE_WAIT_S:
        return
    while (wait := newest + 1 - time.time()) > 0:
        time.sleep(wait)


def _drop_rows_after(path: Path, step: int) -> float:
    """Keep the rows of ``path`` up to global ``step`` (no file: nothing to do); returns the last
    kept row's ``wall_time`` (0 when none).

    The rows kept are nearly always the file's first ones: the file is then cut in place, which
    needs no free space (so a job resumed on a nearly full disk starts); otherwise it is
    rewritten atomically.
    """
    if not path.exists():
        return 0.0
    data = path.read_bytes()
    kept: list[bytes] = []
    wall_time = 0.0
    prefix_end = 0  # bytes of the leading rows kept
    scattered = False  # a kept row after a dropped one: the kept rows are no prefix
    dropped = False
    offset = 0
    for line in data.splitlines(keepends=True):
        offset += len(line)
        try:
            row = json.loads(line)
            keep = row["step"] <= step
        except (ValueError, KeyError, TypeError):  # a line cut short by a killed job
            keep = False
        if not keep:
            dropped = True
            continue
        kept.append(line if line.endswith(b"\n") else line + b"\n")
        wall_time = float(row.get("wall_time", wall_time))
        scattered = scattered or dropped
        prefix_end = offset
    if scattered:
        write_atomically(path, lambda f: f.write(b"".join(kept)))
        return wall_time
    if prefix_end < len(data):
        os.truncate(path, prefix_end)
    if prefix_end and not data[:prefix_end].endswith(b"\n"):  # a whole last row without its newline
        end = AppendFile(path)
        try:
            end.append(b"\n")
        finally:
            end.close()
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
