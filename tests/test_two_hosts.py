"""One job across two real hosts (two network namespaces on a veth pair, see hosts.py), with no
MASTER_ADDR exported anywhere: torchrun, ddprl's own spawner, srun-style SLURM tasks and the
JAX engine. Each job trains, writes one run directory on host A only, and its checkpoint
evaluates. Without root these tests skip (the fixture says why)."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import JAX_TINY, REPO, run_cli

from ddprl.metrics import read_metrics

# Tiny PPO on CartPole: two iterations of 64 steps per env.
PPO = ["n_steps=64", "batch_size=64", "epochs=2", "progress=false", "eval_episodes=2", "dist_timeout=90", "steps=1024"]
# Tiny QMIX on Level-Based Foraging: 400 warm-up steps, then an update every 100 global steps.
QMIX = [
    "task=Foraging-5x5-2p-1f-v3",
    "algo=qmix",
    "num_envs=4",
    "batch_size=4",
    "buffer_size=64",
    "update_every=100",
    "log_freq=200",
    "eval_episodes=2",
    "progress=false",
    "dist_timeout=90",
    "steps=800",
]
# Tiny PPO on gymnax CartPole, one JAX process (with one device) per host.
JAX = [*JAX_TINY, "eval_episodes=2", "dist_timeout=90", "steps=512"]
PORT = 29500  # every port is free on a fresh host
TIMEOUT = 240  # per job: a few times what it takes on two busy cores


def ddprl(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddprl", *args]


def steps_of(args: list[str]) -> int:
    return int(next(a for a in args if a.startswith("steps=")).split("=")[1])


def check_job(hosts, results, args: list[str], world_size: int) -> Path:
    """Every process exited 0; one run directory, on host A; metrics to the last step; the
    checkpoint holds the whole job; it evaluates on host A."""
    assert [r.returncode for r in results] == [0] * len(results), "".join(r.tail() for r in results)
    runs = hosts.a.cwd / "runs"
    assert runs.is_dir(), "".join(r.tail() for r in results)
    run_dirs = list(runs.iterdir())
    assert len(run_dirs) == 1, run_dirs
    run = run_dirs[0]
    assert list(hosts.b.cwd.iterdir()) == []  # host B writes nothing
    assert read_metrics(run)[-1]["step"] == steps_of(args)
    assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == world_size
    ckpt = torch.load(run / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
    assert ckpt["world_size"] == world_size and len(ckpt["ranks"]) == world_size
    assert ckpt["step"] == steps_of(args)
    ev = hosts.run_one(
        hosts.a,
        ddprl("eval", f"checkpoint={run / 'checkpoints' / 'latest.pt'}", "episodes=3", "device=cpu"),
        timeout=TIMEOUT,
    )
    assert ev.returncode == 0, ev.tail()
    assert re.search(r"^return_mean=-?[0-9.]+ ", ev.stdout, re.MULTILINE), ev.stdout
    return run


@pytest.mark.parametrize("args", [PPO, QMIX], ids=["ppo", "qmix"])
@pytest.mark.slow
def test_torchrun_two_hosts(two_hosts, args):
    """One torchrun agent per host; the workers meet at host A's name (PPO, and QMIX)."""
    jobs = [
        (
            host,
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={i}",
                "--nproc-per-node=1",
                f"--master-addr={two_hosts.a.name}",
                f"--master-port={PORT}",
                "-m",
                "ddprl",
                "train",
                *args,
            ],
            None,
        )
        for i, host in enumerate(two_hosts.hosts)
    ]
    run = check_job(two_hosts, two_hosts.run(jobs, TIMEOUT), args, world_size=2)
    if "algo=qmix" in args:
        assert read_metrics(run)[-1]["train/updates"] > 0


@pytest.mark.slow
def test_spawn_two_hosts(two_hosts):
    """``ddprl train`` on each host spawns its two ranks; rank 0 is on host A."""
    jobs = [
        (
            host,
            ddprl(
                "train",
                "world_size=4",
                "nnodes=2",
                f"node_rank={i}",
                f"master_addr={two_hosts.a.name}",
                f"master_port={PORT}",
                *PPO,
            ),
            None,
        )
        for i, host in enumerate(two_hosts.hosts)
    ]
    check_job(two_hosts, two_hosts.run(jobs, TIMEOUT), PPO, world_size=4)


def srun_env(hosts, node: int, local: int, tasks_per_node: int, job_id: int) -> dict[str, str]:
    """What a real ``srun`` inside ``sbatch --nodes=2 --ntasks-per-node=N`` sets for one task
    (on the nodes ``gpu[01-02]``); no MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE."""
    names = [h.name for h in hosts.hosts]
    nodelist = "gpu[01-02]"
    assert names == ["gpu01", "gpu02"]  # the bracket range names these hosts
    ntasks = tasks_per_node * len(names)
    rank = node * tasks_per_node + local
    host = hosts.hosts[node]
    return {
        "SLURM_CLUSTER_NAME": "cluster",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_CPUS_ON_NODE": "2",
        "SLURM_DISTRIBUTION": "block",
        "SLURM_GTIDS": ",".join(str(node * tasks_per_node + i) for i in range(tasks_per_node)),
        "SLURM_JOB_ACCOUNT": "default",
        "SLURM_JOB_CPUS_PER_NODE": f"2(x{len(names)})",
        "SLURM_JOB_GID": "0",
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": "ddprl",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(names)),
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_QOS": "normal",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_USER": "root",
        "SLURM_LAUNCH_NODE_IPADDR": hosts.a.addr,  # srun runs in the batch script, on the first node
        "SLURM_LOCALID": str(local),
        "SLURM_MPI_TYPE": "none",
        "SLURM_NNODES": str(len(names)),
        "SLURM_NODEID": str(node),
        "SLURM_NODELIST": nodelist,
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_PRIO_PROCESS": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_SRUN_COMM_HOST": hosts.a.addr,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(len(names)),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{len(names)})",
        "SLURM_SUBMIT_DIR": str(hosts.a.cwd),
        "SLURM_SUBMIT_HOST": hosts.a.name,
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(names)})",
        "SLURM_TOPOLOGY_ADDR": host.name,
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_UMASK": "0022",
        "SLURMD_NODENAME": host.name,
    }


@pytest.mark.slow
def test_slurm_two_hosts(two_hosts):
    """srun tasks, one per host: rank 0's host is the node list's first, the port comes from
    the job id, and nobody exports MASTER_ADDR."""
    job_id = random.randrange(100_000, 1_000_000)
    jobs = [
        (host, ddprl("train", *PPO), srun_env(two_hosts, node, 0, 1, job_id))
        for node, host in enumerate(two_hosts.hosts)
    ]
    for host, _, env in jobs:
        assert not {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"} & set(host.env(env))
    check_job(two_hosts, two_hosts.run(jobs, TIMEOUT), PPO, world_size=2)


@pytest.mark.slow
def test_jax_two_hosts(two_hosts):
    """The JAX engine, one process per host (``world_size=auto`` is one per node)."""
    jobs = [
        (
            host,
            ddprl(
                "train", "nnodes=2", f"node_rank={i}", f"master_addr={two_hosts.a.name}", f"master_port={PORT}", *JAX
            ),
            None,
        )
        for i, host in enumerate(two_hosts.hosts)
    ]
    check_job(two_hosts, two_hosts.run(jobs, TIMEOUT), JAX, world_size=2)


@pytest.mark.slow
def test_a_two_machine_checkpoint_evaluates_in_one_process(tmp_path):
    """A spawn-mode job over two machines saves nnodes=2 in its config; ``ddprl eval`` (and the
    supervised evaluation) of its checkpoint is one process on one machine all the same. Runs
    without root: the spawner's and the JAX engine's tests above find this on real hosts."""

    def as_if_from_two_machines(path: Path) -> Path:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt["config"].update(world_size=4, nnodes=2, node_rank=1, master_addr="gpu01", master_port="29500")
        torch.save(ckpt, path)
        return path

    tiny = ["world_size=1", "progress=false", "device=cpu", "checkpoint_freq=0"]
    res = run_cli(
        [
            "train",
            *tiny,
            f"run_dir={tmp_path / 'ppo'}",
            "steps=128",
            "num_envs=2",
            "n_steps=64",
            "batch_size=64",
            "epochs=1",
            "eval_episodes=0",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = as_if_from_two_machines(tmp_path / "ppo" / "checkpoints" / "latest.pt")
    res = run_cli(["eval", f"checkpoint={ckpt}", "episodes=2"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"^return_mean=-?[0-9.]+ .* episodes=2$", res.stdout, re.MULTILINE), res.stdout

    task = "task=supervised_fns:tiny_task"  # importable from tests/
    res = run_cli(
        ["train", "algo=supervised", task, *tiny, "epochs=1", f"run_dir={tmp_path / 'sup'}"], cwd=REPO / "tests"
    )
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = as_if_from_two_machines(tmp_path / "sup" / "checkpoints" / "latest.pt")
    res = run_cli(["eval", f"checkpoint={ckpt}", task, "split=val"], cwd=REPO / "tests")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "val/num_samples=37" in res.stdout, res.stdout
