"""EPyMARL's ``src/main.py`` run unchanged under EPyMARL's own Python, with timing probes (standard library and
EPyMARL's modules only): ``EPYMARL_PROBE_OUT=out.json python epymarl_probe.py EPYMARL_DIR MAIN_PY_ARGS...``.

out.json: {"calls": [[t, t_env, updates before, [episode returns], test_s so far, cpu_s], ...] one per training runner
call (``time.perf_counter()`` at its end), "train_s" (in the learner's ``train``), "test_s", "updates", "t_env", "start"
(the first training call's), "end"}. Sacred's file observer writes under EPYMARL_PROBE_SACRED_DIR (else a temporary
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

    probe = {"calls": [], "train_s": 0.0, "test_s": 0.0, "updates": 0, "t_env": 0, "start": None, "end": None}

    def wrap_run(cls):
        original = cls.run

        def run(self, test_mode=False):
            begin = time.perf_counter()
            probe["start"] = probe["start"] or (None if test_mode else begin)
            batch = original(self, test_mode=test_mode)
            if test_mode:
                probe["test_s"] += time.perf_counter() - begin
                return batch
            returns = batch["reward"].sum(dim=(1, 2)).tolist()  # raw rewards; unfilled steps are 0
            probe["t_env"], end = int(self.t_env), time.perf_counter()
            probe["calls"].append(
                [end, probe["t_env"], probe["updates"], returns, probe["test_s"], time.process_time()]
            )
            return batch

        cls.run = run

    wrap_run(EpisodeRunner)
    wrap_run(ParallelRunner)
    original_train = QLearner.train

    def train(self, *args, **kwargs):
        begin = time.perf_counter()
        result = original_train(self, *args, **kwargs)
        probe["train_s"], probe["updates"] = probe["train_s"] + time.perf_counter() - begin, probe["updates"] + 1
        return result

    QLearner.train = train
    sacred_dir = os.environ.get("EPYMARL_PROBE_SACRED_DIR") or tempfile.mkdtemp(prefix="epymarl-sacred-")
    create, results = sacred.observers.FileStorageObserver.create.__func__, os.path.join(src, os.pardir, "results")
    moved = lambda cls, base, *a, **k: create(cls, os.path.join(sacred_dir, os.path.relpath(base, results)), *a, **k)  # noqa: E731
    sacred.observers.FileStorageObserver.create = classmethod(moved)
    sys.argv = [os.path.join(src, "main.py"), *sys.argv[2:]]
    try:
        runpy.run_path(os.path.join(src, "main.py"), run_name="__main__")
    finally:
        probe["end"] = probe["calls"][-1][0] if probe["calls"] else None
        if os.environ.get("EPYMARL_PROBE_OUT"):
            with open(os.environ["EPYMARL_PROBE_OUT"], "w") as f:
                json.dump(probe, f)
        if not os.environ.get("EPYMARL_PROBE_SACRED_DIR"):
            shutil.rmtree(sacred_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
