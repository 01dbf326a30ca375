"""Faults a user can act on get one line and a clear exit code, never a traceback or a hang, and
leave a run directory that resumes: a full disk (a real tmpfs, exit 74), a second job in a run
directory (refused while the first holds its lock, accepted once that holder is SIGKILLed),
an unknown task for ``keys``, a frozen encoder that is not there, a file that is no checkpoint.

Real files, real processes; a full disk is a tmpfs mounted here (root only: skipped otherwise).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import cli_env, fill, resize, run_cli, tmpfs
from conftest import start_job as start

from ddprl.checkpoint import FORMAT_VERSION, load_checkpoint, save_atomically
from ddprl.config import load_config, save_yaml
from ddprl.errors import DISK_FULL_EXIT_CODE, DiskFull, UsageError
from ddprl.files import AppendFile
from ddprl.metrics import _drop_rows_after, read_metrics
from ddprl.runlock import LOCK_NAME, lock, run_dir_held, unlock

# 2 ranks x 4 envs x 64 steps: 512 global steps an iteration; a checkpoint is ~155 kB
PPO = [
    "world_size=2",
    "device=cpu",
    "compile=false",  # eager, as these runs are short whatever their budget
    "n_steps=64",
    "batch_size=64",
    "epochs=1",
    "progress=false",
    "eval_episodes=0",
    "eval_freq=0",
    "dist_timeout=60",
]
INFO_LINE = re.compile(r"\[RANK 0\] \d\d:\d\d:\d\d INFO ")


def said(stderr: str) -> list[str]:
    """What a job said beyond rank 0's INFO lines (its progress log)."""
    return [line for line in stderr.splitlines() if line.strip() and not INFO_LINE.match(line)]


def one_error_line(res: subprocess.CompletedProcess, code: int, pattern: str) -> str:
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = said(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("ddprl: error: "), res.stderr[-3000:]
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def leftovers(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.rglob("*") if p.name.endswith(".tmp") or p.name == LOCK_NAME)


# -- a full disk -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_disk_ends_the_job_in_one_line_and_resume_auto_goes_on(tmp_path):
    with tmpfs(tmp_path / "disk", "260k") as disk:
        run_dir = disk / "run"
        job = ["train", *PPO, f"run_dir={run_dir}", "checkpoint_freq=2048", "keep_last=3"]
        # the checkpoint of step 2048 fits, the second one (at 4096) does not
        res = run_cli([*job, "steps=8192"], cwd=tmp_path, timeout=180)
        line = one_error_line(res, DISK_FULL_EXIT_CODE, r"no space left on device writing .*step_4096\.pt")
        room = re.search(r"\(([\d,]+) bytes needed, ([\d,]+) free\)", line)
        needed, free = (int(n.replace(",", "")) for n in room.groups())
        assert needed > free and needed > 100_000, line
        assert f"resume=auto run_dir={run_dir}" in line
        assert leftovers(run_dir) == []  # the partial checkpoint removed, no lock left behind
        assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"] == 2048  # the last one intact
        before = steps(run_dir)
        assert before == sorted(set(before)) and before[-1] >= 2048

        # a job SIGKILLed while saving leaves its .tmp (here 500 kB, leaving less room than a
        # checkpoint needs): the next job removes it, and with it finds the room to go on
        resize(disk, "800k")
        (run_dir / "checkpoints" / "step_9999.pt.tmp").write_bytes(os.urandom(500_000))
        res = run_cli([*job, "steps=6144", "resume=auto"], cwd=tmp_path, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        after = steps(run_dir)
        assert after == sorted(set(after)) and after[-1] == 6144  # no step twice, none back
        assert after[after.index(2048) + 1] == 2048 + 512  # the resumed rows follow the checkpoint
        assert leftovers(run_dir) == []


def test_what_does_not_fit_leaves_each_file_as_it_was(tmp_path):
    """Checkpoints and config.yaml are renamed into place or not at all; a metrics row goes in
    whole or not at all; cutting rows for a resume needs no free space."""
    with tmpfs(tmp_path / "disk", "64k") as disk:
        ckpt, config, metrics = disk / "latest.pt", disk / "config.yaml", disk / "metrics.jsonl"
        save_atomically({"format_version": FORMAT_VERSION, "step": 1}, ckpt)
        save_yaml(load_config(["progress=false"]), config)
        rows = AppendFile(metrics)
        for step in (1, 2, 3):
            rows.append((json.dumps({"step": step, "wall_time": float(step)}) + "\n").encode())
        kept = {p: p.read_bytes() for p in (ckpt, config, metrics)}
        fill(disk)

        bigger = {"format_version": FORMAT_VERSION, "step": 2, "w": torch.zeros(20_000)}
        with pytest.raises(
            DiskFull, match=r"no space left on device writing .*latest\.pt \([\d,]+ bytes needed, 0 free\)"
        ) as e:
            save_atomically(bigger, ckpt)
        needed = int(re.search(r"\(([\d,]+) bytes", str(e.value)).group(1).replace(",", ""))
        assert needed > 80_000  # the whole file's size, not what went in before the disk was full
        with pytest.raises(DiskFull, match=r"writing .*config\.yaml \([\d,]+ bytes needed, 0 free\)"):
            save_yaml(load_config(["progress=false", "seed=7"]), config)
        with pytest.raises(DiskFull, match=r"writing .*metrics\.jsonl \(8,001 bytes needed"):
            rows.append(b"x" * 8000 + b"\n")  # the rest of a page fits: the row would go in cut short
        rows.close()
        assert {p: p.read_bytes() for p in (ckpt, config, metrics)} == kept
        assert sorted(p.name for p in disk.iterdir()) == ["config.yaml", "filler", "latest.pt", "metrics.jsonl"]

        assert _drop_rows_after(metrics, 2) == 2.0  # a resume from step 2 on the full disk
        assert [r["step"] for r in read_metrics(disk)] == [1, 2]


# -- one job per run directory ---------------------------------------------------------------------------


def kill_group(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)


def lock_is_free(run_dir: Path) -> bool:
    fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_second_job_is_refused_until_the_first_is_killed(tmp_path):
    run_dir = tmp_path / "run"
    job = ["train", *PPO, f"run_dir={run_dir}", "checkpoint_freq=1024"]
    first = start([*job, "steps=100000000"], tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "latest.pt").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
        config = (run_dir / "config.yaml").read_bytes()

        second = run_cli([*job, "steps=2048"], cwd=tmp_path, timeout=120)
        line = one_error_line(second, 2, rf"run_dir={run_dir} is in use by another job")
        assert f"pid {first.pid} on host {socket.gethostname()} since " in line
        second = run_cli([*job, "steps=2048", "resume=auto"], cwd=tmp_path, timeout=120)
        one_error_line(second, 2, r"is in use by another job")
        assert (run_dir / "config.yaml").read_bytes() == config and len(list((run_dir / "tb").iterdir())) == 1

        # the holder dies (SIGKILL, no clean-up): its lock goes with it, whatever its ranks still do
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert lock_is_free(run_dir)
    finally:
        kill_group(first)
    saved = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"]
    res = run_cli([*job, f"steps={saved + 1024}", "resume=auto"], cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    after = steps(run_dir)
    assert after == sorted(set(after)) and after[-1] == saved + 1024
    assert after[after.index(saved) + 1] == saved + 512
    assert not (run_dir / LOCK_NAME).exists()  # a job that ended released and removed it


FORK_AND_HOLD = """
import os, sys, time
from types import SimpleNamespace
from ddprl.runlock import run_dir_held

with run_dir_held(SimpleNamespace(run_dir=sys.argv[1], node_rank=0)):
    if os.fork() == 0:  # a worker forked by the job (an env process): outlives the holder here
        time.sleep(60)
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
"""


def test_no_forked_child_keeps_the_lock_of_a_killed_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FORK_AND_HOLD), str(run_dir)],
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not lock_is_free(run_dir)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        children = subprocess.run(["pgrep", "-s", str(holder.pid)], capture_output=True, text=True).stdout.split()
        assert children, "the forked child should still run"
        assert lock_is_free(run_dir)
    finally:
        kill_group(holder)


def test_the_lock_comes_and_goes_with_the_job(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = SimpleNamespace(run_dir=str(tmp_path / "new" / "run"), node_rank=0)
    with run_dir_held(cfg) as held:
        assert held.run_dir == cfg.run_dir and not lock_is_free(Path(cfg.run_dir))
        with pytest.raises(UsageError, match=r"is in use by another job \(pid \d+ on host "):
            lock(Path(cfg.run_dir), tries=1)
    assert not (tmp_path / "new").exists()  # made for a job that wrote nothing: removed again

    default = load_config(["progress=false"])
    with run_dir_held(default) as held:  # no run_dir: a new default one, named and locked here
        assert re.fullmatch(r"runs/ppo-CartPole-v1-\d{8}-\d{6}", held.run_dir)
        assert (tmp_path / held.run_dir / LOCK_NAME).exists()
        (tmp_path / held.run_dir / "config.yaml").write_text("seed: 1\n")
    assert sorted(p.name for p in (tmp_path / held.run_dir).iterdir()) == ["config.yaml"]

    def cannot(fd: int, op: int) -> None:  # some NFS mounts
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", cannot)
    assert lock(tmp_path) is None
    assert "cannot be locked on its filesystem (flock: No locks available)" in capsys.readouterr().err
    unlock(tmp_path, None)


# -- bad input in one line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["task=NoSuchTask-v9"], r"unknown task 'NoSuchTask-v9'"),
        (["task=CartPol-v1"], r"unknown task 'CartPol-v1' \(did you mean CartPole-v1"),
        (["algo=supervised", "task=digit"], r"unknown supervised task 'digit' \(did you mean digits\?\)"),
    ],
)
def test_keys_of_an_unknown_task(tmp_path, args, pattern):
    res = run_cli(["keys", *args], cwd=tmp_path, timeout=120)
    one_error_line(res, 2, pattern)
    assert res.stdout == ""


def test_eval_of_a_file_that_is_no_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    save_yaml(load_config(["progress=false"]), run_dir / "config.yaml")
    res = run_cli(["eval", f"checkpoint={run_dir / 'config.yaml'}"], cwd=tmp_path, timeout=120)
    one_error_line(
        res, 2, rf"config\.yaml is not a checkpoint: give a \.pt file .* or a run directory \(this file's: {run_dir}\)"
    )


@pytest.mark.slow
def test_frozen_encoder_without_an_encoder(tmp_path):
    pytest.importorskip("lbforaging")
    no_encoder = tmp_path / "qmix.pt"
    torch.save(
        {
            "format_version": FORMAT_VERSION,
            "algo": "qmix",
            "step": 0,
            "config": {"encoder_dim": 0},
            "state": {"networks": {"agent": {}, "mixer": {}}},
        },
        no_encoder,
    )
    job = ["train", "algo=qmix", "task=Foraging-8x8-2p-2f-coop-v3", "world_size=1", f"init_from={no_encoder}"]
    res = run_cli([*job, "freeze_encoder=true"], cwd=tmp_path, timeout=120)
    one_error_line(
        res,
        2,
        r"freeze_encoder=true keeps an observation encoder fixed, but encoder_dim=0 builds none; "
        r"init_from=.* has none either \(it holds agent, mixer\)",
    )
    res = run_cli([*job, "freeze_encoder=true", "encoder_dim=8"], cwd=tmp_path, timeout=120)
    one_error_line(res, 2, r"freeze_encoder=true keeps init_from's encoder, but .* has none")
    assert not (tmp_path / "runs").exists()
