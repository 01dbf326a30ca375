"""Run EPyMARL's ``src/main.py`` unchanged, with timing probes; started by ``qmix_speed.py``.

This file runs under EPyMARL's own Python (its venv), never under ddprl's, and imports only the
standard library and EPyMARL's modules (it copies none of EPyMARL's code):

    EPYMARL_PROBE_OUT=out.json OMP_NUM_THREADS=1 /work/peers/epymarl-venv/bin/python \\
        benchmarks/epymarl_probe.py /work/peers/epymarl --config=qmix --env-config=gymma \\
        with env_args.time_limit=50 env_args.key=lbforaging:Foraging-8x8-2p-2f-coop-v3 t_max=20000 use_cuda=False

Everything after the EPyMARL directory is EPyMARL's own command line (``src/main.py ARGS``).
Before ``src/main.py`` runs (as ``__main__``, so its ``torch.set_num_threads(1)`` and sacred
set-up happen exactly as on the command line), three things are wrapped:

- the runner's ``run`` (episode and parallel runner): per training call its wall-clock end time,
  ``t_env`` after it, and the returns of the episodes it played (the sum of the batch's stored
  raw rewards per episode); test-mode calls are timed apart and not counted;
- the learner's ``train`` (``QLearner``): the number of calls and the seconds spent in them;
- ``smaclite``: EPyMARL's ``envs/__init__.py`` imports it unconditionally although only its
  SMAClite environments use it, and it is not on PyPI; an empty stand-in module is registered
  when the real one is missing (a gymma task never touches it).

With ``EPYMARL_PROBE_NO_SACRED=1`` a no-op observer stands in for sacred's FileStorageObserver
(nothing written) and ``--capture=no`` turns sacred's stdout capture off; by default both stay as
EPyMARL ships them, but the observer writes into ``EPYMARL_PROBE_SACRED_DIR`` (default: a
temporary directory removed at the end) instead of ``results/sacred`` in the EPyMARL tree.

At the end ``EPYMARL_PROBE_OUT`` (a path) receives JSON: ``{"calls": [[t, t_env, n_updates,
[returns...], test_s, cpu_s], ...], "train_s": ..., "test_s": ..., "updates": ..., "t_env": ...,
"start": ..., "end": ...}``, one call per training runner call, with ``t`` (its end) from
``time.perf_counter()``, ``n_updates`` the learner updates before it, ``test_s`` the seconds
spent in test-mode runner calls so far and ``cpu_s`` this process's CPU time
(``time.process_time()``: all its threads, not the parallel runner's env processes); ``start`` is
taken when the first training runner call begins (after imports, sacred, environment and network
construction); ``train_s`` is the time spent in the learner's ``train``.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import sys
import tempfile
import time
import types


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    src = os.path.join(root, "src")
    out_path = os.environ.get("EPYMARL_PROBE_OUT")
    sys.path.insert(0, src)
    # A SIGTERM (timeout, kill) ends the run through the finally below: the probe's JSON and the
    # temporary sacred directory are still written and removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        import smaclite  # noqa: F401
    except ImportError:
        sys.modules["smaclite"] = types.ModuleType("smaclite")

    import sacred.observers
    from learners.q_learner import QLearner
    from runners.episode_runner import EpisodeRunner
    from runners.parallel_runner import ParallelRunner
    from sacred.observers.base import RunObserver

    probe = {"calls": [], "train_s": 0.0, "test_s": 0.0, "updates": 0, "t_env": 0, "start": None, "end": None}

    def wrap_run(cls):
        original = cls.run

        def run(self, test_mode=False):
            begin = time.perf_counter()
            if not test_mode and probe["start"] is None:
                probe["start"] = begin
            batch = original(self, test_mode=test_mode)
            end = time.perf_counter()
            if test_mode:
                probe["test_s"] += end - begin
            else:
                returns = batch["reward"].sum(dim=(1, 2)).tolist()  # raw rewards; unfilled steps are 0
                probe["calls"].append(
                    [end, int(self.t_env), probe["updates"], returns, probe["test_s"], time.process_time()]
                )
                probe["t_env"] = int(self.t_env)
            return batch

        cls.run = run

    wrap_run(EpisodeRunner)
    wrap_run(ParallelRunner)

    original_train = QLearner.train

    def train(self, *args, **kwargs):
        begin = time.perf_counter()
        result = original_train(self, *args, **kwargs)
        probe["train_s"] += time.perf_counter() - begin
        probe["updates"] += 1
        return result

    QLearner.train = train

    sacred_dir = None
    argv = sys.argv[2:]
    if os.environ.get("EPYMARL_PROBE_NO_SACRED") == "1":
        # No file observer (a no-op RunObserver in its place) and sacred's own --capture=no.
        sacred.observers.FileStorageObserver.create = classmethod(lambda cls, *a, **k: RunObserver())
        argv.append("--capture=no")
    else:
        sacred_dir = os.environ.get("EPYMARL_PROBE_SACRED_DIR") or tempfile.mkdtemp(prefix="epymarl-sacred-")
        original_create = sacred.observers.FileStorageObserver.create.__func__
        results = os.path.join(src, os.pardir, "results")

        def create(cls, basedir, *args, **kwargs):
            moved = os.path.join(sacred_dir, os.path.relpath(basedir, results))
            return original_create(cls, moved, *args, **kwargs)

        sacred.observers.FileStorageObserver.create = classmethod(create)

    sys.argv = [os.path.join(src, "main.py")] + argv
    try:
        runpy.run_path(os.path.join(src, "main.py"), run_name="__main__")
    finally:
        probe["end"] = probe["calls"][-1][0] if probe["calls"] else None
        if out_path:
            with open(out_path, "w") as f:
                json.dump(probe, f)
        if sacred_dir and not os.environ.get("EPYMARL_PROBE_SACRED_DIR"):
            shutil.rmtree(sacred_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
