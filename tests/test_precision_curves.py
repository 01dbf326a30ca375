"""benchmarks/precision_curves.py on a short Breakout run: each precision's run stops at its step count with its
record kept and its state removed, a run stopped sooner keeps its state and goes on from it, and the report reads
both precisions' curves; a results row's seeds count only at the precision its own command names."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import precision_curves as P  # noqa: E402 (the path above first)
from results import training  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool"),
]
KEYS = "task=Breakout-v5 world_size=1 device=cpu num_envs=4 n_steps=16 minibatches=1 epochs=1 steps=100000"
KEYS += " checkpoint_freq=64 compile=false eval_freq=0 eval_episodes=0"


def test_runs_stop_at_their_steps_keep_their_records_and_go_on_elsewhere(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(P, "WORK", tmp_path / "work")
    monkeypatch.setattr(P, "POLL_S", 0.2)
    monkeypatch.setattr(P, "keys_of", lambda task, precision: [*KEYS.split(), f"precision={precision}"])
    # the results row's fp32 seeds: none here
    monkeypatch.setattr(P.store, "RUNS", tmp_path / "results")
    progress = {p: tmp_path / "runs" / f"Breakout-v5-{p}" / training.IN_PROGRESS / "seed1" for p in P.PRECISIONS}

    P.train("Breakout-v5", "fp32", 1, 512, resume=False)
    assert not (progress["fp32"] / training.STATE).exists()  # got there: no state to commit
    assert P.trained("Breakout-v5", "fp32", 1)[-1]["step"] >= 512
    # a sitting's end before 512 steps: the state is kept, and goes on on another machine (no work directory)
    work = tmp_path / "work" / "Breakout-v5-bf16" / "seed1"
    sitting_end = threading.Thread(target=P.stop_at, args=(128, work / "metrics.jsonl", threading.Event()))
    sitting_end.start()
    with pytest.raises(SystemExit) as stopped:
        P.train("Breakout-v5", "bf16", 1, 512, resume=False)
    sitting_end.join()
    assert stopped.value.code == 75 and (progress["bf16"] / training.STATE).exists()
    first = P.trained("Breakout-v5", "bf16", 1)[-1]["step"]
    assert 128 <= first < 512
    shutil.rmtree(work)
    P.train("Breakout-v5", "bf16", 1, 512, resume=True)
    assert "goes on from its kept checkpoint" in capsys.readouterr().out
    steps = [r["step"] for r in P.trained("Breakout-v5", "bf16", 1)]
    assert steps[-1] >= 512 and steps == sorted(set(steps)) and not (progress["bf16"] / training.STATE).exists()
    P.train("Breakout-v5", "bf16", 1, 512, resume=True)  # already there: nothing runs
    assert "trained to" in capsys.readouterr().out.splitlines()[-1]
    P.report("Breakout-v5", 512, 1)
    table = capsys.readouterr().out
    assert "| fp32 | 1 | " in table and "| bf16 | 1 | " in table


def test_a_results_rows_seeds_count_only_at_the_precision_its_command_trains_at(tmp_path, monkeypatch):
    """The row's own command decides: a precision its keys name, never ``auto`` (the preset's)."""
    from types import SimpleNamespace

    monkeypatch.setattr(P, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(P.store, "RUNS", tmp_path / "results")
    row = P.results_row("Breakout-v5")
    seed1 = tmp_path / "results" / row / "seed1"
    seed1.mkdir(parents=True)
    (seed1 / "metrics.jsonl.gz").touch()
    keys = "task=Breakout-v5 world_size=2 device=cpu".split()
    cases = ([], None), (["precision=fp32"], "fp32"), (["precision=bf16"], "bf16"), (["precision=auto"], None)
    for given, counts_for in cases:  # the Atari preset's own precision is auto
        monkeypatch.setitem(P.ROWS, row, SimpleNamespace(keys=[*keys, *given]))
        for precision in P.PRECISIONS:
            assert P.row_trains_at("Breakout-v5", precision) == (precision == counts_for)
            assert P.kept_dirs("Breakout-v5", precision, 1) == ([seed1] if precision == counts_for else [])
    assert P.keys_of("Breakout-v5", "fp32")[-1] == "precision=fp32"  # each run names its precision
