"""Where the results page's kept runs came from (benchmarks/results): every kept run has its provenance, a run kept
now records the code, command and versions it ran with, and a kept run whose row now resolves to other values is
found stale."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
sys.path.insert(0, str(RESULTS.parent))  # the results package, and the benchmarks' modules it imports
from results import peers, provenance, store, training  # noqa: E402 (the path above first)


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    for name, path in (("RUNS", "runs"), ("WORK", "work"), ("IMAGES", "results"), ("PAGE", "results.md")):
        monkeypatch.setattr(store, name, tmp_path / path)
    return tmp_path


def head() -> str | None:
    """The checkout's commit (None outside a git checkout, as ``store.code_state`` says)."""
    git = subprocess.run(["git", "-C", str(store.ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return git.stdout.strip() or None


def test_every_kept_run_has_its_provenance():
    kept = provenance.kept_runs()
    assert len(kept) > 100  # every row's seeds, peers' too, attempts and the reconstructer's stages
    for _, folder in kept:
        path = folder / store.PROVENANCE
        assert path.exists(), f"{folder}: no {store.PROVENANCE}"
        record = json.loads(path.read_text())
        assert re.fullmatch(r"[0-9a-f]{40}", record["commit"] or ""), folder
        assert record["command"] and record["machine"] and re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]), folder
        assert record["torch"] or record["torch_note"], folder
        assert record["recorded"] in ("at the run", "afterwards, from git history"), folder
        assert record.get("library_commit", "x") and record["dirty"] in (True, False, None), folder


def test_a_run_kept_now_records_the_commit_and_torch_it_ran_with(tmp_path):
    import torch

    origin = store.code_state()  # as the run starts
    store.write_provenance(tmp_path, "ddprl train task=CartPole-v1 seed=1", origin, extra="kept")
    record = json.loads((tmp_path / store.PROVENANCE).read_text())
    assert record["commit"] == head() and record["dirty"] in ((True, False) if head() else (None,))
    assert (record["torch"], record["python"]) == (torch.__version__, platform.python_version())
    assert record["command"] == "ddprl train task=CartPole-v1 seed=1" and record["machine"] == store.this_machine()
    assert record["recorded"] == "at the run" and record["extra"] == "kept"


def test_a_long_run_keeps_the_code_of_its_first_sitting_and_says_when_a_later_one_ran_other_code(tmp_path):
    first, later = (
        {"wall_s": 3600.0, "machine": m, "commit": c * 40, "dirty": d}
        for m, c, d in (("A", "a", False), ("B", "b", True))
    )
    training.keep_provenance(tmp_path, "ddprl train x seed=1", {"commit": "c" * 40, "dirty": False}, [first, later])
    record = json.loads((tmp_path / store.PROVENANCE).read_text())
    assert (record["commit"], record["dirty"], record["sitting_commits"]) == ("a" * 40, False, ["a" * 40, "b" * 40])
    assert record["machine"] == "A (1.0 h) + B (1.0 h)"


def test_a_ddprl_run_and_a_library_run_keep_their_provenance(tmp_store, monkeypatch):
    """``train_and_keep`` (a fake ``ddprl train`` writes the run) keeps the command as run without its scratch
    run_dir; a library row keeps its own command with the seed and the library's commit."""

    class FakeTrain:
        def __init__(self, cmd, **kwargs):
            run_dir = Path(next(c for c in cmd if c.startswith("run_dir=")).split("=", 1)[1])
            run_dir.mkdir(parents=True)
            (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/return_mean": 1.0}) + "\n")
            (run_dir / "config.yaml").write_text("seed: 3\n")

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(training, "subprocess", SimpleNamespace(Popen=FakeTrain))  # git's subprocesses as they are
    training.train_and_keep(("task=CartPole-v1", "world_size=2"), 3, tmp_store / "seed3", "x", {"JAX_PLATFORMS": "cpu"})
    record = json.loads((tmp_store / "seed3" / store.PROVENANCE).read_text())
    command = "JAX_PLATFORMS=cpu ddprl train task=CartPole-v1 world_size=2 progress=false checkpoint_freq=0 "
    assert record["command"] == command + "keep_last=1 seed=3" and record["commit"] == head()

    library = {"library": "CleanRL", "library_commit": "fe8d8a0", "torch": "2.0", "python": "3.10"}
    one = lambda seed: ([{"step": 1, "train/episode_return": float(seed)}], 1.0, {})  # noqa: E731
    peers.run_library_row(
        "cleanrl-humanoid-v4", 1, False, 1, "python ppo.py", "train/episode_return", one, library, "--seed {}"
    )
    record = json.loads((store.RUNS / "cleanrl-humanoid-v4" / "seed1" / store.PROVENANCE).read_text())
    assert (record["command"], record["library_commit"], record["torch"]) == (
        "python ppo.py --seed 1",
        "fe8d8a0",
        "2.0",
    )


@pytest.mark.parametrize("row,folder", [("ppo-cartpole", "seed1"), ("jax-cartpole", "jax1-seed1")])
def test_a_kept_run_whose_row_gives_another_value_is_stale(tmp_store, row, folder):
    copy = store.RUNS / row / folder
    shutil.copytree(RESULTS / "runs" / row / folder, copy)
    assert provenance.stale_keys(row, copy) == []
    text = (copy / "config.yaml").read_text()
    lr = yaml.safe_load(text)["lr"]
    (copy / "config.yaml").write_text(re.sub(r"^lr: .*$", "lr: 0.5", text, flags=re.M))
    assert provenance.stale_keys(row, copy) == [f"lr: 0.5 -> {lr}"]
    runs = RESULTS / "runs"  # no ddprl config to compare: PureJaxRL's run, a library's
    assert provenance.stale_keys("jax-cartpole", runs / "jax-cartpole" / "purejaxrl-seed1") == []
    assert provenance.stale_keys("cleanrl-humanoid-v4", runs / "cleanrl-humanoid-v4" / "seed1") == []
