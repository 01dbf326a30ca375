"""Faults on one of two hosts while a job trains across both (two network namespaces on a veth
pair, see hosts.py; ``ddprl train`` on each host spawns its two ranks, rank 0 and the run
directory are on host A, gpu01, where host B sees it too, as on a shared file system).

Each fault is injected once the job has saved a checkpoint: host B's ranks SIGKILLed; host B's
ranks SIGSTOPped (continued once host A gave up); the link cut from inside host B (mended after);
the run directory's disk filled; SIGTERM to host B's launcher. For each, on both hosts: the job
ends by itself within ``dist_timeout`` plus :data:`GRACE`, its last line names the rank and host
at fault, no process is left, every checkpoint still loads, and ``resume=auto`` on the same two
hosts trains on from the last checkpoint with every logged step after the one before: nothing
repeated, nothing lost. Without root these tests skip (the fixture says why).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import fill, tmpfs

from ddprl.errors import DISK_FULL_EXIT_CODE
from ddprl.metrics import read_metrics
from ddprl.runtime.preemption import PREEMPTED_EXIT_CODE

DIST_TIMEOUT = 20
# After dist_timeout: the roll call of the heartbeats (~4 s), a store request that cannot reach
# its host (5 s), the launcher stopping its other rank, and two busy cores.
GRACE = 30
STEP = 256  # global steps per iteration: 4 ranks x 1 env x 64 steps
PPO = [
    "world_size=4",
    "nnodes=2",
    "master_addr=gpu01",
    "master_port=29500",
    "num_envs=4",
    "n_steps=64",
    "batch_size=64",
    "epochs=2",
    "compile=false",  # eager, as these runs are short whatever their budget
    f"checkpoint_freq={8 * STEP}",
    "keep_last=0",
    "eval_episodes=2",
    "progress=false",
    f"dist_timeout={DIST_TIMEOUT}",
]


@dataclass(frozen=True)
class Fault:
    """What is done to the job, and what each host's last line says (regular expressions)."""

    inject: Callable  # (hosts, launchers' jobs) -> None
    codes: tuple[int, int]  # exit codes of hosts A and B
    says_a: str
    says_b: str
    restore: Callable | None = None  # (hosts, jobs) once host A ended: what ends the fault


def ranks_of(hosts, job) -> list[int]:
    """The ranks a launcher started (its children running multiprocessing's spawn)."""
    found = []
    for pid in hosts.pids(job.host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == job.proc.pid and b"spawn_main" in cmdline:
            found.append(pid)
    assert len(found) == 2, found
    return found


def signal_ranks(sig: int) -> Callable:
    def inject(hosts, jobs) -> None:
        for pid in ranks_of(hosts, jobs[1]):
            os.kill(pid, sig)

    return inject


def continue_ranks(hosts, jobs) -> None:
    for pid in hosts.pids(hosts.b):
        os.kill(pid, signal.SIGCONT)


def fill_the_disk(hosts, jobs) -> None:
    fill(hosts.a.cwd / "disk")


def term_launcher_b(hosts, jobs) -> None:
    jobs[1].proc.send_signal(signal.SIGTERM)


LOST_B = r"^ddprl: ranks 2, 3 on gpu02 stopped answering \(rank [01] on gpu01: .+\)$"
FAULTS = {
    "sigkill": Fault(
        signal_ranks(signal.SIGKILL), (1, 1), LOST_B, r"^ddprl: rank [23] on gpu02 exited with code -9 \(SIGKILL\)$"
    ),
    "sigstop": Fault(
        signal_ranks(signal.SIGSTOP),
        (1, 1),
        LOST_B,
        r"^ddprl: rank [23] on gpu02 was not running for \d+ s \(stopped, or its machine froze\)",
        restore=continue_ranks,
    ),
    "link-cut": Fault(
        lambda hosts, jobs: hosts.cut(hosts.b),
        (1, 1),
        LOST_B,
        r"^ddprl: rank [23] on gpu02 lost contact with gpu01, the host of rank 0 \(.+\)$",
        restore=lambda hosts, jobs: hosts.mend(hosts.b),
    ),
    "disk-full": Fault(
        fill_the_disk,
        (DISK_FULL_EXIT_CODE, DISK_FULL_EXIT_CODE),
        r"^ddprl: error: rank 0 on gpu01: no space left on device writing .*disk/run/.*resume=auto",
        r"^ddprl: error: rank 0 on gpu01: no space left on device writing .*disk/run/.*resume=auto",
    ),
    "sigterm": Fault(
        term_launcher_b,
        (PREEMPTED_EXIT_CODE, PREEMPTED_EXIT_CODE),
        r"stopped by SIGTERM on ranks 2, 3 on gpu02 at step \d+, checkpoint saved",
        r"stopped by SIGTERM on ranks 2, 3 on gpu02 at step \d+, checkpoint saved",
    ),
}


def job(hosts, run: Path, *extra: str) -> list:
    return [
        (host, [sys.executable, "-m", "ddprl", "train", f"node_rank={i}", *PPO, f"run_dir={run}", *extra], None)
        for i, host in enumerate(hosts.hosts)
    ]


def wait_for_a_checkpoint(jobs, run: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not list(run.glob("checkpoints/step_*.pt")):
        ended = [j for j in jobs if j.proc.poll() is not None]
        assert not ended and time.monotonic() < deadline, "no checkpoint:\n" + "".join(
            j.result(j.proc.returncode).tail() for j in jobs
        )
        time.sleep(0.2)


def wait_until_ended(hosts, jobs, fault: Fault, since: float) -> list[float]:
    """Seconds from ``since`` until each launcher ended by itself; applies ``fault.restore`` once
    host A ended. Fails past dist_timeout + GRACE (after the restore, for host B)."""
    ended: dict[int, float] = {}
    restored_at = None
    while len(ended) < 2:
        now = time.monotonic()
        for i, j in enumerate(jobs):
            if i not in ended and j.proc.poll() is not None:
                ended[i] = now - since
        if fault.restore is not None and 0 in ended and restored_at is None:
            fault.restore(hosts, jobs)
            restored_at = now
        limit = DIST_TIMEOUT + GRACE + (0 if restored_at is None else restored_at - since)
        if now - since > limit:
            results = hosts.wait(jobs, timeout=0)
            pytest.fail(f"not ended within {limit:.0f} s: {ended}\n" + "".join(r.tail() for r in results))
        time.sleep(0.1)
    return [ended[0], ended[1]]


def nothing_left(hosts, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while left := {h.name: hosts.pids(h) for h in hosts.hosts if hosts.pids(h)}:
        assert time.monotonic() < deadline, f"processes left behind: {left}"
        time.sleep(0.2)


def checkpoints_load(run: Path) -> int:
    """Every checkpoint file loads; no partial file is left. Returns the last step saved."""
    files = sorted((run / "checkpoints").iterdir())
    assert not [f for f in files if f.name.endswith(".tmp")], files
    steps = [torch.load(f, map_location="cpu", weights_only=True)["step"] for f in files if f.suffix == ".pt"]
    return max(steps)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("ddprl: ") or "stopped by" in line]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("name", list(FAULTS))
@pytest.mark.slow
def test_a_fault_on_one_host(two_hosts, name):
    fault, hosts = FAULTS[name], two_hosts
    with tmpfs(hosts.a.cwd / "disk", "8m"):
        run = hosts.a.cwd / "disk" / "run"  # both hosts see it, as on a shared file system
        jobs = hosts.start(job(hosts, run, "steps=10000000"))
        try:
            wait_for_a_checkpoint(jobs, run)
            injected = time.monotonic()
            fault.inject(hosts, jobs)
            took = wait_until_ended(hosts, jobs, fault, injected)
            nothing_left(hosts)
        finally:
            if fault.restore is not None:
                fault.restore(hosts, jobs)
            results = hosts.wait(jobs, timeout=0)
        print(f"{name}: ended {took[0]:.1f} s (A) and {took[1]:.1f} s (B) after the fault")  # for docs/distributed.md
        report = "".join(r.tail() for r in results)
        assert tuple(r.returncode for r in results) == fault.codes, report
        assert re.search(fault.says_a, last_line(results[0].stderr)), report
        assert re.search(fault.says_b, last_line(results[1].stderr)), report
        assert "Traceback" not in results[0].stderr + results[1].stderr, report
        saved = checkpoints_load(run)
        assert list(hosts.b.cwd.iterdir()) == []  # host B writes nothing

        (hosts.a.cwd / "disk" / "filler").unlink(missing_ok=True)
        kept = [row for row in read_metrics(run) if row["step"] <= saved]
        total = saved + 3 * STEP
        results = hosts.run(job(hosts, run, f"steps={total}", "resume=auto"), timeout=240)
        report = "".join(r.tail() for r in results)
        assert [r.returncode for r in results] == [0, 0], report
        rows = read_metrics(run)
        assert rows[: len(kept)] == kept  # resumed, not started afresh
        steps = [row["step"] for row in rows]
        assert steps == list(range(STEP, total + 1, STEP)), steps  # nothing repeated, nothing lost
        assert checkpoints_load(run) == total


@pytest.mark.slow
def test_a_run_directory_that_only_one_host_sees_is_refused(two_hosts):
    """Host B has no copy of host A's run directory (no shared file system): instead of ranks
    that start afresh beside ranks that resume, waiting for each other until dist_timeout, the
    job ends at once in one line on each host, exit code 2."""
    hosts = two_hosts
    first = hosts.run_one(
        hosts.a,
        [sys.executable, "-m", "ddprl", "train", "world_size=1", "num_envs=1", *PPO[5:], "steps=512", "run_dir=runs/x"],
        timeout=240,
    )
    assert first.returncode == 0, first.tail()
    results = hosts.run(job(hosts, Path("runs/x"), "steps=1024", "resume=auto"), timeout=120)
    report = "".join(r.tail() for r in results)
    assert [r.returncode for r in results] == [2, 2], report
    said = "ranks 2, 3 on gpu02 found no checkpoint, rank 0 the checkpoint of step 512"
    assert f"ddprl: error: {said}" in results[0].stderr, report
    assert said in results[1].stderr, report
    assert "Traceback" not in results[0].stderr + results[1].stderr, report
