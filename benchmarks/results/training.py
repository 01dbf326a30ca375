"""Training a row's seeds with ``ddprl train``: one process per seed, ``jobs`` at once, each kept as it
ends; a long row's seeds go on from their checkpoints across sittings, and a stop signal to the
script reaches the runs it started."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import store
from .rows import ROWS, SUPERVISED_ROWS, SupervisedRow
from .stats import curve, measure
from .store import (
    IN_PROGRESS,
    LOST,
    ROOT,
    SITTINGS,
    add_sitting,
    keep_run,
    kept_seeds,
    read_rows,
    seed_of,
    seed_summary,
    set_aside_lost,
    sittings,
    sittings_machine,
    sittings_wall,
    write_summary,
)

COMMON = ("progress=false", "checkpoint_freq=0", "keep_last=1")


class Stopped(Exception):
    """A long row's run stopped by SIGTERM/SIGUSR1 with a checkpoint saved (``ddprl train`` exit 75)."""


LIVE_RUNS: set[subprocess.Popen] = set()  # the ddprl processes this script waits on
STOPPING = threading.Event()  # a stop signal came: no seed starts after it


def pass_on_stop_signals() -> None:
    """SIGTERM or SIGUSR1 to this script goes on to the runs it started: a long row's run then saves
    a checkpoint and exits 75 (``--resume`` goes on from it), any other run stops; no further seed
    starts. TD-MPC2 acts on it at its next agent step, or when its pretraining burst ends (the
    burst is one step: ~20 min at model_size 1 on a core of the 2-core CPU)."""

    def forward(signum: int, frame: object) -> None:
        STOPPING.set()
        for proc in list(LIVE_RUNS):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)


def train_and_keep(
    keys: tuple[str, ...], seed: int, keep: Path, what: str, env: dict | None = None, work: Path | None = None
) -> float:
    """``ddprl train KEYS seed=SEED`` in a scratch directory; its metrics.jsonl and config.yaml
    copied to ``keep``. Returns the wall time of the whole command (start-up included).

    ``work`` (long rows): train in that directory instead, going on from its latest checkpoint
    where an earlier sitting left one; a run stopped with a checkpoint raises :class:`Stopped`, a
    finished one's directory is removed once kept (its agent kept by :func:`keep_final_agent`). Its
    wall time is then the sum of its sittings' (each one's whole command, kept in ``SITTINGS`` with
    its machine as it ends, and with the kept run: the metrics' ``wall_time`` restarts in each
    process, and nothing marks where when a sitting was short)."""
    with contextlib.ExitStack() as stack:
        run_dir = work or Path(stack.enter_context(tempfile.TemporaryDirectory())) / "run"
        resume = work is not None and (work / "checkpoints" / "latest.pt").exists()
        set_keys = {key.split("=")[0] for key in keys}
        common = [key for key in COMMON if key.split("=")[0] not in set_keys]  # the row's own keys win
        cmd = [sys.executable, "-m", "ddprl", "train", *keys, *common, f"seed={seed}", f"run_dir={run_dir}"]
        cmd += ["resume=auto"] if resume else []
        print("$", " ".join(cmd[2:]), flush=True)
        start = time.time()
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "disable"), **(env or {})}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        LIVE_RUNS.add(proc)
        try:
            code = proc.wait()
        finally:
            LIVE_RUNS.discard(proc)
        progress = keep.parent / IN_PROGRESS / keep.name
        if work is not None and work.is_dir():  # a run refused at its start (exit 2) made no directory
            add_sitting(work, time.time() - start)
            if code == 75:
                keep_run(run_dir, progress, SITTINGS)  # how far it got, on the page until the seed ends
                raise Stopped(f"{what}: stopped with a checkpoint in {work}; `--resume` goes on from it")
        if code != 0:
            raise SystemExit(f"{what}: ddprl train exited {code}")
        if work is not None:  # ended: its in-progress copy gives way to the kept run
            shutil.rmtree(progress, ignore_errors=True)
            with contextlib.suppress(OSError):
                progress.parent.rmdir()  # once empty
        keep_run(run_dir, keep, *([SITTINGS] if work is not None else []))  # a long row's: where it ran
    if work is None:
        return round(time.time() - start, 1)
    wall = sittings_wall(sittings(work))
    keep_final_agent(work)
    shutil.rmtree(work)
    return round(wall, 1)


def keep_final_agent(work: Path) -> None:
    """A finished long run's last checkpoint (the agent, not the replay buffer), kept as
    ``final/<seed>.pt`` beside the work directories (git-ignored): the row's few evaluation episodes
    can then be told from the agent's own failure rate by evaluating it again over more
    (``ddprl eval checkpoint=... episodes=N``) without training the seed again."""
    latest = work / "checkpoints" / "latest.pt"
    if latest.exists():
        final = work.parent / "final" / f"{work.name}.pt"
        final.parent.mkdir(exist_ok=True)
        shutil.copyfile(latest, final)  # latest.pt may be a link into the directory removed next


def run_row(name: str, seeds: int, resume: bool = False, jobs: int = 1) -> dict:
    """Train seeds 1..``seeds`` of a row, ``jobs`` at once, keep each run and rewrite
    ``summary.json`` as each seed ends (a row stopped part-way keeps the seeds it finished).
    ``resume``: keep the seeds the summary already holds and train only the others (a long row
    across several sittings: each of its seeds also goes on from where the last sitting stopped it)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    row = ROWS.get(name) or SUPERVISED_ROWS[name]
    out = store.RUNS / name
    results, missing = seeds_to_train(out, name, row.command(), seeds, resume)
    at_once = max(1, min(jobs, len(missing)))

    halt = threading.Event()  # a run failed or was stopped: no seed starts after it

    def one(seed: int) -> float | None:
        if halt.is_set() or STOPPING.is_set():
            return None
        work = store.WORK / name / f"seed{seed}" if getattr(row, "long", False) else None
        if work is not None and not resume:  # not resuming: no seed goes on from an earlier sitting either
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(out / IN_PROGRESS / f"seed{seed}", ignore_errors=True)
            for lost in (out / LOST).glob("seed*"):
                if seed_of(lost.name) == seed:
                    shutil.rmtree(lost)
        elif work is not None and (lost := set_aside_lost(out, seed, work)):
            print(
                f"{name} seed {seed}: no checkpoint in {work} to go on from: starts again; "
                f"how far it got is kept in {lost.relative_to(ROOT)}",
                flush=True,
            )
        try:
            return train_and_keep(row.keys, seed, out / f"seed{seed}", f"{name} seed {seed}", work=work)
        except (SystemExit, Stopped):
            halt.set()
            raise

    stopped, failed = [], []
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        runs = {pool.submit(one, seed): seed for seed in missing}
        for done in as_completed(runs):
            seed = runs[done]
            try:
                wall = done.result()
            except Stopped as e:
                print(e, flush=True)
                stopped.append(seed)
                continue
            except SystemExit as e:  # a failed run: no seed starts after it, those running are kept
                print(e, flush=True)
                failed.append(str(e))
                continue
            if wall is None:  # not started: an earlier run failed or was stopped
                continue
            keep = out / f"seed{seed}"
            if isinstance(row, SupervisedRow):
                final = read_rows(keep)[-1]
                entry = {
                    "seed": seed,
                    "wall_s": wall,
                    f"test/{row.metric}": final[f"test/{row.metric}"],
                    "baselines": row.baselines(seed),
                }
            else:
                rows = read_rows(keep)
                at_reference = [measure(rows, ref) for ref in row.references]
                machine = sittings_machine(sittings(keep)) if getattr(row, "long", False) else None
                entry = {**seed_summary(seed, wall, curve(rows), machine), "at_reference": at_reference}
            results.append({**entry, **({"jobs": at_once} if at_once > 1 else {})})
            print(f"{name} seed {seed}: {results[-1]}", flush=True)
            results.sort(key=lambda s: s["seed"])
            write_summary(out, name, row.command(), results)
    if failed:
        raise SystemExit(failed[0])
    if stopped:
        raise SystemExit(75)  # as ddprl's own exit: stopped with checkpoints, `--resume` goes on
    return json.loads((out / "summary.json").read_text())  # also when every seed was kept


def seeds_to_train(out: Path, name: str, command: str, seeds: int, resume: bool) -> tuple[list[dict], list[int]]:
    """The seeds kept from earlier sittings (``resume``: :func:`store.kept_seeds`; none otherwise) and the
    seeds of 1..``seeds`` still to train."""
    kept = kept_seeds(out, name, command, seeds) if resume else []
    for seed in sorted(s["seed"] for s in kept):
        print(f"{name} seed {seed}: kept from an earlier sitting", flush=True)
    return kept, [seed for seed in range(1, seeds + 1) if all(s["seed"] != seed for s in kept)]
