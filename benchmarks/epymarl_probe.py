"""EPyMARL's ``src/main.py`` run unchanged under EPyMARL's own Python, with timing probes (standard library and
EPyMARL's modules only): ``EPYMARL_PROBE_OUT=out.json python epymarl_probe.py EPYMARL_DIR MAIN_PY_ARGS...``.

out.json: {"calls": [[t, t_env, updates before, test_s so far], ...]}, one per training runner call
(``time.perf_counter()`` at its end). Sacred's file observer writes under EPYMARL_PROBE_SACRED_DIR (else a temporary
directory); ``smaclite``, imported by EPyMARL whatever the task and not on PyPI, is stubbed when missing.
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
    src = os.path.join(os.path.abspath(sys.argv[1]), "src")
    sys.path.insert(0, src)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # out through the finally below
    try:
        import smaclite  # noqa: F401
    except ImportError:
        sys.modules["smaclite"] = types.ModuleType("smaclite")
    import sacred.observers
    from learners.q_learner import QLearner
    from runners.episode_runner import EpisodeRunner
    from runners.parallel_runner import ParallelRunner

    calls, counts = [], {"test_s": 0.0, "updates": 0}

    def probe_run(cls) -> None:
        original = cls.run

        def run(self, test_mode=False, **kwargs):
            begin = time.perf_counter()
            batch = original(self, test_mode=test_mode, **kwargs)
            if test_mode:
                counts["test_s"] += time.perf_counter() - begin
            else:
                calls.append([time.perf_counter(), int(self.t_env), counts["updates"], counts["test_s"]])
            return batch

        cls.run = run

    probe_run(EpisodeRunner)
    probe_run(ParallelRunner)
    original_train = QLearner.train

    def train(self, *args, **kwargs):
        counts["updates"] += 1
        return original_train(self, *args, **kwargs)

    QLearner.train = train
    sacred_dir = os.environ.get("EPYMARL_PROBE_SACRED_DIR") or tempfile.mkdtemp(prefix="epymarl-sacred-")
    create, results = sacred.observers.FileStorageObserver.create.__func__, os.path.join(src, os.pardir, "results")

    def moved(cls, base, *args, **kwargs):
        return create(cls, os.path.join(sacred_dir, os.path.relpath(base, results)), *args, **kwargs)

    sacred.observers.FileStorageObserver.create = classmethod(moved)
    sys.argv = [os.path.join(src, "main.py"), *sys.argv[2:]]
    try:
        runpy.run_path(os.path.join(src, "main.py"), run_name="__main__")
    finally:
        if os.environ.get("EPYMARL_PROBE_OUT"):
            with open(os.environ["EPYMARL_PROBE_OUT"], "w") as f:
                json.dump({"calls": calls}, f)
        if not os.environ.get("EPYMARL_PROBE_SACRED_DIR"):
            shutil.rmtree(sacred_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
