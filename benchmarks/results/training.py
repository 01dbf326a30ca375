"""Training a row's seeds with ``ddprl train``, ``jobs`` at once. A long row's seed trains in ``WORK`` across sittings
from its checkpoint (each in ``sittings.json``), how far it got kept in ``runs/<row>/in_progress/`` and an attempt
whose checkpoint went with its machine in ``lost/``; a stop signal to the script reaches the runs it started. The
supervised rows' baselines are fitted on ddprl's own split (train + val) and scored on its test split."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import store
from .rows import ROWS, SUPERVISED_ROWS, TRAIN
from .store import at_steps, curve, window_mean

COMMON = ("progress=false", "checkpoint_freq=0", "keep_last=1")  # the row's own keys win
IN_PROGRESS, LOST, SITTINGS, STATE = "in_progress", "lost", "sittings.json", "state.pt"
STATE_LIMIT = 25 * 2**20  # the largest checkpoint kept in the repository between sittings
LIVE_RUNS: set[subprocess.Popen] = set()  # the ddprl processes this script waits on
STOPPING = threading.Event()  # a stop signal came: no seed starts after it


class Stopped(Exception):
    """A long row's run stopped by SIGTERM/SIGUSR1 with a checkpoint saved (``ddprl train`` exit 75)."""


def pass_on_stop_signals() -> None:
    def forward(signum: int, frame: object) -> None:
        STOPPING.set()
        for proc in list(LIVE_RUNS):
            proc.send_signal(signum)  # a long row's run checkpoints and exits 75

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)


def sittings(run: Path) -> list[dict]:
    """Each sitting of a long row's run so far: ``wall_s`` and ``machine`` (None where a bare number was kept)."""
    kept = json.loads((run / SITTINGS).read_text()) if (run / SITTINGS).exists() else []
    return [s if isinstance(s, dict) else {"wall_s": s, "machine": None} for s in kept]


def sittings_machine(kept: list[dict]) -> str:
    """The machine of a seed's sittings: the one, or each with its hours ('A (9.1 h) + B (3.0 h)')."""
    hours: dict[str | None, float] = {}
    for sitting in kept:
        hours[sitting["machine"]] = hours.get(sitting["machine"], 0.0) + sitting["wall_s"] / 3600
    if len(hours) == 1 and None not in hours:
        return next(iter(hours))
    return " + ".join(f"{machine or 'machine not recorded'} ({h:.1f} h)" for machine, h in hours.items())


def keep_run(run_dir: Path, keep: Path, *more: str) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for file in ("metrics.jsonl", "config.yaml", *more):
        shutil.copy(run_dir / file, keep / file)
    store.pack(keep)


def train_and_keep(keys, seed: int, keep: Path, what: str, env: dict | None = None, work: Path | None = None) -> float:
    """``ddprl train KEYS seed=SEED`` in a scratch directory, its metrics and config copied to ``keep``; returns
    its wall time. ``work`` (long rows): train there, going on from its latest checkpoint; a run stopped with
    one raises :class:`Stopped` after keeping how far it got; the wall time is then the sum of the sittings',
    and the final agent is kept as ``final/<seed>.pt`` beside the work directories (to evaluate again)."""
    with contextlib.ExitStack() as stack:
        run_dir = work or Path(stack.enter_context(tempfile.TemporaryDirectory())) / "run"
        common = [key for key in COMMON if key.split("=")[0] not in {k.split("=")[0] for k in keys}]
        cmd = [sys.executable, "-m", "ddprl", "train", *keys, *common, f"seed={seed}", f"run_dir={run_dir}"]
        cmd += ["resume=auto"] if work is not None and (work / "checkpoints" / "latest.pt").exists() else []
        print("$", " ".join(cmd[2:]), flush=True)
        # the command as run, for its provenance: the variables it was given, without the scratch run_dir
        words = [f"{k}={v}" for k, v in (env or {}).items() if v] + ["ddprl", *cmd[3:]]
        command = " ".join(word for word in words if not word.startswith("run_dir="))
        origin = store.code_state()  # the code it runs: the tree may change before it is kept
        start = time.time()
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "disable"), **(env or {})}
        proc = subprocess.Popen(cmd, cwd=store.ROOT, env=env)
        LIVE_RUNS.add(proc)
        try:
            code = proc.wait()
        finally:
            LIVE_RUNS.discard(proc)
        progress = keep.parent / IN_PROGRESS / keep.name
        if work is not None and work.is_dir():  # a run refused at its start (exit 2) made no directory
            sitting = {"wall_s": round(time.time() - start, 1), "machine": store.this_machine(), **origin}
            (work / SITTINGS).write_text(json.dumps([*sittings(work), sitting]) + "\n")
            if code == 75:
                keep_run(run_dir, progress, SITTINGS)
                keep_provenance(progress, command, origin, sittings(work))
                keep_state(work, progress)
                raise Stopped(f"{what}: stopped with a checkpoint in {work}; `--resume` goes on from it")
        if code != 0:
            raise SystemExit(f"{what}: ddprl train exited {code}")
        if work is not None:  # ended: its in-progress copy gives way to the kept run
            shutil.rmtree(progress, ignore_errors=True)
            with contextlib.suppress(OSError):
                progress.parent.rmdir()
        keep_run(run_dir, keep, *([SITTINGS] if work is not None else []))
        keep_provenance(keep, command, origin, sittings(work) if work is not None else [])
    if work is None:
        return round(time.time() - start, 1)
    if (latest := work / "checkpoints" / "latest.pt").exists():
        (work.parent / "final").mkdir(exist_ok=True)
        shutil.copyfile(latest, work.parent / "final" / f"{work.name}.pt")
    wall = sum(s["wall_s"] for s in sittings(work))
    shutil.rmtree(work)
    return round(wall, 1)


def keep_provenance(keep: Path, command: str, origin: dict, kept: list[dict]) -> None:
    """A run's provenance; a long run's (``kept``: its sittings) has the code of its first sitting, the run's
    start, the machine of each sitting, and each sitting's commit where they differ."""
    first = next((s for s in kept if "commit" in s), origin)
    commits = list(dict.fromkeys(s["commit"] for s in kept if "commit" in s))
    more = {"machine": sittings_machine(kept)} if kept else {}
    more |= {"sitting_commits": commits} if len(commits) > 1 else {}
    store.write_provenance(keep, command, {"commit": first["commit"], "dirty": first["dirty"]}, **more)


def keep_state(work: Path, progress: Path) -> None:
    """A stopped seed's checkpoint beside its record, to commit, where it fits ``STATE_LIMIT`` (model, optimizer,
    normalizers, counters and RNG; a replay buffer does not fit): the next sitting goes on from it anywhere."""
    latest, state = work / "checkpoints" / "latest.pt", progress / STATE
    state.unlink(missing_ok=True)
    if latest.exists() and latest.stat().st_size <= STATE_LIMIT:
        shutil.copyfile(latest, state)
    elif latest.exists():
        print(
            f"{progress.name}: checkpoint of {latest.stat().st_size / 2**20:.0f} MB, over the "
            f"{STATE_LIMIT / 2**20:.0f} MB kept in the repository: it goes on only where {work} is kept",
            flush=True,
        )


def restore_state(out: Path, seed: int, work: Path) -> bool:
    """A seed's run directory rebuilt in ``work`` from its kept record and ``state.pt`` when ``work`` holds no
    checkpoint (a sitting on another machine); ``resume=auto`` then goes on from it, its metrics cut back to the
    checkpoint's step by ddprl. False where there is nothing to rebuild from."""
    progress = out / IN_PROGRESS / f"seed{seed}"
    if (work / "checkpoints" / "latest.pt").exists() or not (progress / STATE).exists():
        return False
    (work / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(progress / STATE, work / "checkpoints" / "latest.pt")
    shutil.copyfile(progress / "config.yaml", work / "config.yaml")
    shutil.copyfile(progress / SITTINGS, work / SITTINGS)
    with gzip.open(progress / "metrics.jsonl.gz", "rb") as src, (work / "metrics.jsonl").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return True


def set_aside_lost(out: Path, seed: int, work: Path) -> Path | None:
    """Move a seed's in-progress record to ``out/lost/`` when ``work`` holds no checkpoint to go on from (a
    sitting on a new machine): the seed starts again, the lost attempt stays kept (each, if lost twice)."""
    progress, lost, attempt = out / IN_PROGRESS / f"seed{seed}", out / LOST / f"seed{seed}", 2
    if not progress.is_dir() or (work / "checkpoints" / "latest.pt").exists():
        return None
    while lost.exists():
        lost, attempt = out / LOST / f"seed{seed}-{attempt}", attempt + 1
    lost.parent.mkdir(parents=True, exist_ok=True)
    progress.rename(lost)
    with contextlib.suppress(OSError):
        progress.parent.rmdir()  # once empty
    return lost


def seeds_to_train(out: Path, name: str, command: str, seeds: int, resume: bool) -> tuple[list[dict], list[int]]:
    """The seeds (of 1..``seeds``) that ``out/summary.json`` holds with their runs kept (``resume`` only: it must
    have run ``command``), and those still to train."""
    done = json.loads((out / "summary.json").read_text()) if resume and (out / "summary.json").exists() else None
    if done and done["command"] != command:
        raise SystemExit(f"{name}: the kept seeds ran `{done['command']}`, the row now runs `{command}`")
    kept = [s for s in done["seeds"] if s["seed"] <= seeds and (out / f"seed{s['seed']}").is_dir()] if done else []
    kept = [{**s, "machine": s.get("machine", done["machine"])} for s in kept]  # older summaries: one for all
    for seed in sorted(s["seed"] for s in kept):
        print(f"{name} seed {seed}: kept from an earlier sitting", flush=True)
    return kept, [seed for seed in range(1, seeds + 1) if all(s["seed"] != seed for s in kept)]


def run_seeds(name: str, missing: list[int], jobs: int, one: Callable, keep: Callable) -> None:
    """``one(seed)`` for each of ``missing``, ``jobs`` at once, and ``keep(seed, result)`` as each ends. A failed
    seed is said and the others go on; the row then exits nonzero, or 75 (as ddprl) when one was stopped."""
    failed, stopped = [], False
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = {pool.submit(one, seed): seed for seed in missing}
        for done in as_completed(runs):
            try:
                result = done.result()
            except Stopped as e:
                print(e, flush=True)
                stopped = True
            except (SystemExit, RuntimeError) as e:
                print(f"{name} seed {runs[done]} failed: {e}", flush=True)
                failed.append(runs[done])
            else:
                if result is not None:  # None: not started after a failure or a stop
                    keep(runs[done], result)
    if failed or stopped:
        raise SystemExit(f"{name}: failed on seed(s) {sorted(failed)}; `--resume` runs them again" if failed else 75)


def run_row(name: str, seeds: int, resume: bool = False, jobs: int = 1) -> dict:
    """Train seeds 1..``seeds`` of a row, rewriting ``summary.json`` as each ends. ``resume``: keep the seeds the
    summary holds, train the others (a long row's go on from their checkpoints)."""
    row = ROWS.get(name) or SUPERVISED_ROWS[name]
    long, out = row.long, store.RUNS / name
    results, missing = seeds_to_train(out, name, row.command(), seeds, resume)
    at_once, halt = max(1, min(jobs, len(missing))), threading.Event()  # halt: a run failed or was stopped

    def one(seed: int) -> float | None:
        if halt.is_set() or STOPPING.is_set():
            return None
        work = store.WORK / name / f"seed{seed}" if long else None
        if work is not None and not resume:  # no seed goes on from an earlier sitting either
            lost = [path for path in (out / LOST).glob("seed*") if path.name.split("-")[0] == f"seed{seed}"]
            for path in (work, out / IN_PROGRESS / f"seed{seed}", *lost):
                shutil.rmtree(path, ignore_errors=True)
        elif work is not None and restore_state(out, seed, work):
            print(f"{name} seed {seed}: goes on from its kept checkpoint ({out / IN_PROGRESS / f'seed{seed}' / STATE})")
        elif work is not None and (lost := set_aside_lost(out, seed, work)):
            print(f"{name} seed {seed}: no checkpoint in {work}: starts again; kept in {lost}", flush=True)
        try:
            return train_and_keep(row.keys, seed, out / f"seed{seed}", f"{name} seed {seed}", work=work)
        except (SystemExit, Stopped):
            halt.set()
            raise

    def keep(seed: int, wall: float) -> None:
        rows = store.read_rows(out / f"seed{seed}")
        if row.dataset:
            graph, entry = row.dataset == "graph_energy", {"seed": seed, "wall_s": wall}
            entry[f"test/{row.metric}"] = rows[-1][f"test/{row.metric}"]
            entry["baselines"] = graph_baselines() if graph else sklearn_baselines(row.dataset, seed)
        else:
            machine = sittings_machine(sittings(out / f"seed{seed}")) if long else None
            entry = store.seed_summary(seed, wall, curve(rows), machine)
            at = lambda ref: (window_mean if ref.metric == TRAIN else at_steps)(curve(rows, ref.metric), ref.steps)  # noqa: E731
            entry["at_reference"] = [at(ref) for ref in row.references]
        results.append({**entry, **({"jobs": at_once} if at_once > 1 else {})})
        print(f"{name} seed {seed}: {results[-1]}", flush=True)
        store.write_summary(out, name, row.command(), sorted(results, key=lambda s: s["seed"]))

    run_seeds(name, missing, at_once, one, keep)
    return store.kept_summary(name)  # also when every seed was kept


def sklearn_baselines(dataset: str, seed: int) -> dict[str, float]:
    """Test accuracy of scikit-learn models fitted on ddprl's train + val (split_seed=0, standardised)."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    from ddprl.supervised.tasks import _tabular_splits

    splits = _tabular_splits(dataset, 0)
    x_fit, y_fit = (torch.cat([splits["train"][i], splits["val"][i]]).numpy() for i in (0, 1))
    x_test, y_test = (t.numpy() for t in splits["test"])
    mlp = MLPClassifier((128, 128), early_stopping=True, max_iter=500, random_state=seed)
    models = {"scikit-learn LogisticRegression": LogisticRegression(max_iter=5000)}
    models["scikit-learn MLPClassifier (128, 128), early stopping"] = mlp
    return {name: float(model.fit(x_fit, y_fit).score(x_test, y_test)) for name, model in models.items()}


@functools.cache  # the same for every seed: generated from the split seed, fitted deterministically
def graph_baselines(bins: int = 100) -> dict[str, float]:
    """Test MSE of the standardised energy on ddprl's graph_energy split: the training mean, and a ridge
    regression on what the energy is a function of, the count of particle pairs in each of ``bins`` distance
    bins (told the answer's form, a sum of pair terms, as the GNN is not: a bound, not a peer)."""
    import numpy as np
    import torch
    from sklearn.linear_model import RidgeCV

    from ddprl.supervised.graph import OPTIONS, graph_splits

    splits = graph_splits(*(OPTIONS[k] for k in ("num_graphs", "min_nodes", "max_nodes", "radius", "split_seed")))
    edges = np.linspace(0.0, OPTIONS["radius"], bins + 1)

    def features(graphs) -> tuple[np.ndarray, np.ndarray]:
        counts = []
        for g in graphs:
            src, dst = g.edge_index
            d = torch.linalg.vector_norm(g.pos[dst] - g.pos[src], dim=1)[src < dst]  # each pair once
            counts.append(np.histogram(d.numpy(), bins=edges)[0])
        return np.array(counts, dtype=np.float64), np.array([g.y.item() for g in graphs])

    x_fit, y_fit = features(splits["train"] + splits["val"])
    x_test, y_test = features(splits["test"])
    predicted = RidgeCV(alphas=np.logspace(-6, 2, 9)).fit(x_fit, y_fit).predict(x_test)
    ridge = f"scikit-learn RidgeCV on pair counts in {bins} distance bins"
    mean, ridged = float(np.mean((y_fit.mean() - y_test) ** 2)), float(np.mean((predicted - y_test) ** 2))
    return {"the training mean": mean, ridge: ridged}
