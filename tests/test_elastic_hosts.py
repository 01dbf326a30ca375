"""torchrun's elastic mode across two real hosts (network namespaces, hosts.py): one host is killed for good while
the job trains; torchrun restarts the workers on the host left and ddprl goes on there, on fewer ranks, from the last
checkpoint, to the end of its budget. Without root this test skips (the fixture says why)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch

from ddprl.metrics import read_metrics

STEP = 512  # global steps per iteration: 8 envs x 64 steps, whatever the ranks
STEPS = 60 * STEP
PPO = [
    "n_steps=64",
    "batch_size=64",
    "epochs=2",
    "num_envs=8",
    "eval_episodes=0",
    "progress=false",
    "dist_timeout=20",
    f"checkpoint_freq={4 * STEP}",
    "keep_last=0",
    f"steps={STEPS}",
]


def torchrun(hosts, run_dir) -> list:
    """One elastic torchrun agent per host (1 to 2 nodes, one worker each), meeting at host A."""
    return [
        (
            host,
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=1:2",
                "--nproc-per-node=1",
                "--max-restarts=2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={hosts.a.name}:29500",
                "--rdzv-id=elastic",
                "--rdzv-conf=last_call_timeout=5",
                "-m",
                "ddprl",
                "train",
                *PPO,
                "resume=auto",
                f"run_dir={run_dir}",
            ],
            {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
        )
        for host in hosts.hosts
    ]


@pytest.mark.slow
def test_a_host_killed_for_good_and_the_job_ends_on_the_other(two_hosts):
    hosts = two_hosts
    run_dir = hosts.a.cwd / "run"  # host B sees it too, as on a shared file system
    jobs = hosts.start(torchrun(hosts, run_dir))
    try:
        deadline = time.monotonic() + 240
        while not list(run_dir.glob("checkpoints/step_*.pt")):
            assert time.monotonic() < deadline and all(j.proc.poll() is None for j in jobs), "no checkpoint"
            time.sleep(0.2)
        first = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
        assert first["world_size"] == 2  # both hosts met
        os.killpg(jobs[1].proc.pid, signal.SIGKILL)  # host B's agent and its worker, for good
        for pid in hosts.pids(hosts.b):
            os.kill(pid, signal.SIGKILL)
        killed_at = read_metrics(run_dir)[-1]["step"]
    finally:
        results = hosts.wait(jobs, timeout=300)
    a = results[0]
    assert a.returncode == 0, a.tail(6000)
    ckpt = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
    assert ckpt["world_size"] == 1 and ckpt["step"] == STEPS
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(STEP, STEPS + 1, STEP)), steps  # every iteration once: none lost, none repeated
    assert killed_at < STEPS
    assert "resuming a 2-rank run on 1 rank" in a.stderr and "batch_size=64 -> 128 per rank" in a.stderr
    synchronised = [line for line in a.stderr.splitlines() if "parameters synchronised across" in line]
    assert "across 2 rank(s)" in synchronised[0] and "across 1 rank(s)" in synchronised[-1], synchronised
