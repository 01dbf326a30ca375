"""Where the time goes: phases, their collectives, nesting, and what the run logs and says."""

from __future__ import annotations

import json
import time

import pytest

from ddprl.timesplit import PHASES, TimeSplit, shares


class Clock:
    """A collective clock the test moves by hand (seconds spent in collectives so far)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_phases_collectives_and_nesting_are_charged_once():
    clock = Clock()
    split = TimeSplit(clock)
    with split.phase("learn"):
        busy(0.05)
        clock.seconds += 0.02  # a collective inside the update, as the runtime's clock counts it
        with split.phase("eval"):  # nested: charged to eval alone
            busy(0.03)
    with split.phase("env"):
        busy(0.02)
    split.move(0.01, "env", "act")
    busy(0.01)  # in no phase: other
    window = split.take()
    assert set(window) == set(PHASES)
    assert window["learn"] == pytest.approx(0.05 - 0.02, abs=0.01)
    assert window["eval"] == pytest.approx(0.03, abs=0.01)
    assert window["collective"] == pytest.approx(0.02)
    assert window["env"] == pytest.approx(0.01, abs=0.01) and window["act"] == pytest.approx(0.01)
    assert window["other"] == pytest.approx(0.01, abs=0.01)
    assert sum(window.values()) == pytest.approx(0.11, abs=0.02)  # the wall time, split without overlap
    # a new window starts empty; collectives outside any phase still count
    clock.seconds += 0.5
    assert split.take()["collective"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not a phase"):
        with split.phase("collective"):
            pass


def test_shares_rank_the_phases():
    assert shares({"learn": 6.0, "env": 3.0, "collective": 1.0, "eval": 0.0}) == "learn 60 %, env 30 %, collective 10 %"
    assert shares(dict.fromkeys(PHASES, 0.0)) == ""


@pytest.mark.slow
def test_every_row_has_the_split_and_the_summary_names_the_largest(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        [
            "train",
            "world_size=2",
            "steps=4096",
            "num_envs=4",
            "n_steps=128",
            "eval_freq=2048",
            "eval_episodes=2",
            "checkpoint_freq=2048",
            "progress=false",
            f"run_dir={run_dir}",
        ],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # a phase is in every row once the run has used it
        assert all(row[f"time/{phase}_s"] >= 0 for phase in ("env", "act", "learn", "collective"))
    assert all(f"time/{phase}_s" in rows[-1] for phase in ("eval", "checkpoint", "other"))
    assert sum(r["time/collective_s"] for r in rows) > 0  # 2 ranks: gradients and metrics are reduced
    assert sum(r.get("time/checkpoint_s", 0.0) for r in rows) > 0  # the checkpoint at step 2048
    assert rows[0]["time/other_s"] < 0.5 * sum(rows[0][f"time/{p}_s"] for p in ("env", "act", "learn"))  # no start-up
    line = next(x for x in result.stdout.splitlines() if x.strip().startswith("time "))
    largest = max(
        ("env", "act", "learn", "collective", "eval", "checkpoint", "other"),
        key=lambda p: sum(r.get(f"time/{p}_s", 0.0) for r in rows),
    )
    assert line.split()[1] == largest
