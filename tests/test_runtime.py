"""The distributed runtime: placement rules (pure functions) and real 2-rank gloo collectives."""

from __future__ import annotations

import functools
import importlib
import os
import socket
import subprocess
import sys
import tempfile
import time

import dist_fns
import pytest
import torch
from torch import nn

from ddprl.config import load_config
from ddprl.errors import UsageError
from ddprl.runtime import (
    RankFailed,
    check_port_free,
    choose_device_and_backend,
    detect_launcher,
    failures,
    launch,
    placement_from_env,
    unwrap,
)
from ddprl.runtime.compat import COMPILED_PREFIX
from ddprl.runtime.placement import Placement, core_share, expand_hostlist, rank_cores, slurm_tasks_per_node


def cfg2(**extra):
    overrides = ["world_size=2", "dist_timeout=60", "progress=false"] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(overrides)


# -- placement (no processes) -------------------------------------------------------------------


def test_detect_launcher():
    assert detect_launcher({}) == "spawn"
    assert detect_launcher({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == "torchrun"
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}
    assert detect_launcher(slurm) == "slurm"
    # an salloc shell with one task is no SLURM launch: ddprl spawns its own processes
    assert detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}) == "spawn"


def test_placement_uses_global_rank_not_local_rank():
    cfg = load_config(["device=cpu"])
    env = {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29555",
    }
    p = placement_from_env(cfg, env)
    assert (p.launcher, p.rank, p.local_rank, p.world_size, p.master_addr, p.master_port) == (
        "torchrun",
        9,
        1,
        16,
        "10.0.0.1",
        29555,
    )
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS_PER_NODE": "4",
        "MASTER_ADDR": "node01",
        "SLURM_JOB_ID": "1234",
    }
    p = placement_from_env(cfg, slurm)
    assert (p.launcher, p.rank, p.local_rank, p.world_size, p.master_addr) == ("slurm", 5, 1, 8, "node01")
    assert p.master_port == 20000 + 1234  # every task derives the same port from the job id
    spawn_cfg = load_config(
        ["device=cpu", "world_size=4", "nnodes=2", "node_rank=1", "master_addr=10.0.0.1", "master_port=29600"]
    )
    p = placement_from_env(spawn_cfg, {}, local_rank=1)
    assert (p.rank, p.local_rank, p.world_size) == (3, 1, 4)


SRUN_2_NODES = {  # what a 2-node `srun --ntasks-per-node=2` gives task 3 (no MASTER_ADDR exported)
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_ID": "777",
    "SLURM_STEP_ID": "0",
}


def test_slurm_rendezvous_follows_the_node_list_without_master_addr(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the pure-Python expansion answers
    p = placement_from_env(load_config(["device=cpu"]), SRUN_2_NODES)
    assert (p.rank, p.local_rank, p.world_size, p.local_world_size) == (3, 1, 4, 2)
    assert (p.master_addr, p.master_port) == ("gpu07", 20777)
    # the user's keys win over the launcher's information
    p = placement_from_env(load_config(["device=cpu", "master_addr=head", "master_port=31000"]), SRUN_2_NODES)
    assert (p.master_addr, p.master_port) == ("head", 31000)
    p = placement_from_env(
        load_config(["device=cpu"]), {**SRUN_2_NODES, "MASTER_ADDR": "ib-gpu07", "MASTER_PORT": "4000"}
    )
    assert (p.master_addr, p.master_port) == ("ib-gpu07", 4000)


def test_expand_slurm_host_lists():
    assert expand_hostlist("gpu[07-08,11]") == ["gpu07", "gpu08", "gpu11"]
    assert expand_hostlist("node1") == ["node1"]
    assert expand_hostlist("a[1-2],b[09-10],c") == ["a1", "a2", "b09", "b10", "c"]
    assert expand_hostlist("rack[1-2]-n[3,5]") == ["rack1-n3", "rack1-n5", "rack2-n3", "rack2-n5"]
    assert expand_hostlist("n[098-101]") == ["n098", "n099", "n100", "n101"]
    assert slurm_tasks_per_node({"SLURM_NTASKS_PER_NODE": "4(x2)"}) == [4, 4]
    assert slurm_tasks_per_node({"SLURM_TASKS_PER_NODE": "2(x3),1"}) == [2, 2, 2, 1]
    p = placement_from_env(
        load_config(["device=cpu"]),
        {
            **SRUN_2_NODES,
            "SLURM_NTASKS": "7",
            "SLURM_PROCID": "6",
            "SLURM_NODEID": "3",
            "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
        },
    )
    assert p.local_world_size == 1
    with pytest.raises(UsageError, match="host list"):
        expand_hostlist("gpu[a-b]")


def test_rendezvous_conflicts_are_refused():
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29555"}
    with pytest.raises(UsageError, match="torchrun sets the rendezvous"):
        placement_from_env(load_config(["device=cpu", "master_addr=10.0.0.2"]), torchrun)
    assert placement_from_env(load_config(["device=cpu", "master_port=29555"]), torchrun).master_port == 29555
    with pytest.raises(UsageError, match="needs master_addr"):
        placement_from_env(
            load_config(["device=cpu", "world_size=4", "nnodes=2", "master_port=29600"]), {}, local_rank=0
        )


def test_device_and_backend_rules():
    cpu = torch.device("cpu")
    assert choose_device_and_backend("auto", "auto", 0, 2, cuda_count=0) == (cpu, "gloo")
    assert choose_device_and_backend("cpu", "auto", 1, 2, cuda_count=4) == (cpu, "gloo")
    # GPUs are simulated by cuda_count: CI has none (the only mock in these tests).
    assert choose_device_and_backend("auto", "auto", 1, 2, cuda_count=2) == (torch.device("cuda", 1), "nccl")
    assert choose_device_and_backend("cuda", "gloo", 3, 4, cuda_count=2) == (torch.device("cuda", 1), "gloo")
    with pytest.raises(UsageError, match="NCCL cannot put two ranks"):
        choose_device_and_backend("cuda", "nccl", 0, 4, cuda_count=2)
    with pytest.raises(UsageError, match="only 2 GPU"):
        choose_device_and_backend("cuda", "auto", 0, 4, cuda_count=2)
    with pytest.raises(UsageError, match="no CUDA device"):
        choose_device_and_backend("cuda", "auto", 0, 1, cuda_count=0)
    with pytest.raises(UsageError, match="backend=nccl needs CUDA"):
        choose_device_and_backend("cpu", "nccl", 0, 1, cuda_count=0)


def test_port_in_use_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UsageError, match=f"master_port={port} is already in use"):
            check_port_free("127.0.0.1", port)


def test_unwrap_strips_compile_and_ddp_layers():
    inner = nn.Linear(2, 2)

    assert unwrap(torch.compile(inner)) is inner  # wraps without compiling (until called)

    class Nested(nn.Module):  # torch.compile's wrapper around another one (torch itself won't nest them)
        def __init__(self, m):
            super().__init__()
            setattr(self, COMPILED_PREFIX.rstrip("."), m)

    assert unwrap(Nested(torch.compile(inner))) is inner
    assert unwrap(inner) is inner


# -- real collectives over gloo, 2 ranks ----------------------------------------------------------


def _results(tmp_path, n=2):
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(n)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
@pytest.mark.parametrize("mode", ["cores", "none"])
def test_cpu_bind_gives_each_rank_its_cores(tmp_path, mode):
    launch(functools.partial(dist_fns.affinity, out=str(tmp_path)), cfg2(cpu_bind=mode))
    r0, r1 = _results(tmp_path)
    cores = sorted(os.sched_getaffinity(0))
    for r in (r0, r1):
        assert r["child"] == r["rank"]  # environment workers stay on their rank's cores
    if mode == "none":  # the default
        assert r0["rank"] == r1["rank"] == cores
    else:
        half = len(cores) // 2
        assert (r0["rank"], r1["rank"]) == (cores[:half], cores[half : 2 * half])
    assert sorted(os.sched_getaffinity(0)) == cores  # the launching process is left as it was


def test_core_share():
    assert core_share(0, 2, [3, 1, 0, 2]) == [0, 1]
    assert core_share(2, 3, list(range(7))) == [4, 5]  # the seventh core is left out: equal shares
    assert core_share(1, 4, [0, 1, 2]) is None


def test_rank_cores_are_a_ranks_own(monkeypatch):
    """The node's only rank: its affinity; a rank cpu_bind=cores bound: its affinity (its share), none where ranks
    outnumber the cores; ranks that share an affinity (GPU ranks, cpu_bind=none): an equal share each."""

    def cores(affinity, local_rank, local_world_size, device="cpu", cpu_bind="none", cpu_count=8):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity))
        monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
        where = Placement(
            "spawn", local_rank, local_rank, local_world_size, local_world_size, "", 0, torch.device(device), "gloo"
        )
        return rank_cores(where, cpu_bind)

    assert cores({5, 4, 6}, 0, 1) == [4, 5, 6]
    assert cores({2, 3}, 1, 4, cpu_bind="cores") == [2, 3]
    assert cores({0, 1}, 1, 4, cpu_bind="cores", cpu_count=2) == []  # 4 ranks, 2 cores: bind_cores left them
    assert cores(range(8), 1, 2) == cores(range(8), 1, 2, device="cuda", cpu_bind="cores") == [4, 5, 6, 7]
    assert cores(range(2), 3, 4) == []


def test_collectives_two_ranks(tmp_path, monkeypatch):
    reports = tmp_path / "tmp"  # where the launcher makes its directory of failure reports
    reports.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(reports))
    launch(functools.partial(dist_fns.collectives, out=str(tmp_path)), cfg2())
    assert list(reports.iterdir()) == []
    r0, r1 = _results(tmp_path)
    for r in (r0, r1):
        assert r["sum"] == 3 and isinstance(r["sum"], int)
        assert r["mean_dict"] == {"a": 15.0, "b": 0.5}
        assert torch.equal(r["tensor_sum"], torch.tensor([2.0, 1.0]))
        assert torch.equal(r["tensor_mean"], torch.tensor([1.0, 1.0])) and r["tensor_mean"].dtype == torch.float32
        assert torch.equal(r["int_mean"], torch.tensor([0.5, 3.0])) and r["int_mean"].dtype == torch.float64
        assert r["broadcast"] == {"from": 0}
        assert r["gathered"] == [0, 2]
        assert torch.equal(r["gathered_tensor"], torch.tensor([[0.0, 0.0], [1.0, 10.0]]))


def test_ranks_flush_denormal_floats_and_a_rank_in_the_callers_process_gives_them_back(tmp_path):
    """Adam's moments decaying into the denormal range slowed a CPU update: every rank flushes them to
    zero, one run in the caller's process (world_size=1) too, and the caller computes with them again after."""
    denormal = (torch.tensor([1e-39]) * 1.0).item()  # a Python float: read under flushing, a tensor's would be 0
    assert denormal != 0.0  # torch's default
    launch(functools.partial(dist_fns.denormal_product, out=str(tmp_path)), cfg2())
    assert [float((tmp_path / f"rank{r}.txt").read_text()) for r in (0, 1)] == [0.0, 0.0]
    assert launch(dist_fns.denormal_product, load_config(["world_size=1", "device=cpu", "progress=false"])) == 0.0
    assert (torch.tensor([1e-39]) * 1.0).item() == denormal


def test_check_in_sync_catches_drift_and_wrap_broadcasts(tmp_path):
    launch(functools.partial(dist_fns.drifted_params, out=str(tmp_path)), cfg2())
    assert all(r["caught"] for r in _results(tmp_path))


def test_failing_rank_takes_job_down_within_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 failed: ValueError: deliberate failure on rank 1"):
        launch(functools.partial(dist_fns.rank_one_raises, out=str(tmp_path)), cfg2(dist_timeout=30))
    assert time.monotonic() - start < 30 + 30  # dist_timeout + margin (spawn start-up included)


@pytest.mark.slow
def test_root_cause_is_the_first_error_not_the_first_process_to_exit(tmp_path, monkeypatch):
    # Rank 0 exits first, with a broken collective's message; rank 1 raised before it but is
    # still ending its process: the launcher names rank 1's error, and leaves no report behind.
    reports = tmp_path / "tmp"
    reports.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(reports))
    with pytest.raises(RankFailed) as exc:
        launch(functools.partial(dist_fns.first_error_exits_last, out=str(tmp_path)), cfg2(dist_timeout=30))
    assert str(exc.value) == "rank 1 failed: ValueError: deliberate failure on rank 1"
    assert "dist_fns.py" in exc.value.traceback and "first_error_exits_last" in exc.value.traceback
    assert list(reports.iterdir()) == []


def test_reports_dirs_of_ended_launchers_are_swept(tmp_path, monkeypatch):
    # A launcher killed with SIGKILL leaves its (empty) reports directory; the next launcher of
    # the host removes it, and never one whose launcher still runs, nor another host's.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = failures._host()
    left = tmp_path / f"{failures.REPORTS_PREFIX}{host}-{int(ended.stdout)}-abc"
    running = tmp_path / f"{failures.REPORTS_PREFIX}{host}-{os.getpid()}-def"
    elsewhere = tmp_path / f"{failures.REPORTS_PREFIX}otherhost-{int(ended.stdout)}-ghi"
    for path in (left, running, elsewhere):
        path.mkdir()
    (left / "process0.json").write_text("{}")
    made = failures.make_reports_dir()
    assert not left.exists() and running.exists() and elsewhere.exists()
    assert os.path.basename(made).startswith(f"{failures.REPORTS_PREFIX}{host}-{os.getpid()}-")


def _failure(rank, time, consequence=False, **kw):
    return failures.Failure(index=rank, rank=rank, time=time, summary=f"E{rank}", consequence=consequence, **kw)


def test_root_cause_rule():
    echo_first, real_later = _failure(0, 1.0, consequence=True), _failure(1, 2.0)
    assert failures.root_cause([echo_first, real_later]) is real_later  # an echo never wins over an error
    assert failures.root_cause([real_later, _failure(2, 1.5)]).rank == 2  # the earliest error
    assert failures.root_cause([_failure(3, 4.0, True), echo_first]) is echo_first  # only echoes: the earliest
    assert failures.root_cause([]) is None
    died = failures.Failure(index=1, rank=None, time=3.0, summary="exited with code -9 (SIGKILL)", reported=False)
    assert failures.root_cause([_failure(0, 5.0, True), died]).message() == "rank 1 exited with code -9 (SIGKILL)"
    assert _failure(4, 0.0).message() == "rank 4 failed: E4"


def test_failure_report_round_trip(tmp_path, monkeypatch):
    path = str(tmp_path / "process0.json")
    monkeypatch.setattr(failures, "_report_path", path)
    try:
        raise RuntimeError("[gloo] Timed out waiting 30000ms for recv\nException raised from recv at pair.cc")
    except RuntimeError as e:
        failures.record_failure(3, e)
    failures.record_failure(3, ValueError("later, while tearing down"))  # the first error stays
    report = failures.read_report(path, 0)
    assert report.rank == 3 and report.consequence and not report.usage
    assert report.summary == "RuntimeError: [gloo] Timed out waiting 30000ms for recv"
    assert "raise RuntimeError" in report.traceback
    assert report.message() == "rank 3 failed: RuntimeError: [gloo] Timed out waiting 30000ms for recv"
    assert failures.read_report(str(tmp_path / "none.json"), 1) is None
    assert not failures.is_consequence(ValueError("Connection closed by peer"))  # not a collective's error
    assert failures.summary(UsageError("bad\nmore")) == "ddprl.errors.UsageError: bad"


class _ExitingProcess:
    """A process whose sentinel is ready at once but whose exit code shows only from its
    ``reaped_at``-th read on: a rank that has closed its files but is not yet reaped."""

    def __init__(self, code, reaped_at):
        self.read_end, self.write_end = os.pipe()
        os.close(self.write_end)  # ready: end of file
        self.sentinel, self.code, self.reads, self.reaped_at = self.read_end, code, 0, reaped_at

    @property
    def exitcode(self):
        self.reads += 1
        return self.code if self.reads >= self.reaped_at else None


def test_launcher_counts_ranks_reaped_between_two_looks():
    """Two preempted ranks (exit 75) that become reapable while the launcher looks at them are
    both counted as ended; the job then exits 75 instead of returning as if it had finished."""
    launch_module = importlib.import_module("ddprl.runtime.launch")  # the package exports launch(), the function

    processes = [_ExitingProcess(75, reaped_at=2), _ExitingProcess(75, reaped_at=2)]
    try:
        ended = launch_module._wait_until_all_end_or_one_fails(processes)
    finally:
        for p in processes:
            os.close(p.read_end)
    assert sorted(ended) == [0, 1]
    failed = [_ExitingProcess(1, reaped_at=1), _ExitingProcess(0, reaped_at=10**6)]
    try:
        assert list(launch_module._wait_until_all_end_or_one_fails(failed)) == [0]  # a failure: stop waiting
    finally:
        for p in failed:
            os.close(p.read_end)


def test_usage_error_inside_a_rank_exits_2(tmp_path, monkeypatch):
    reports = tmp_path / "tmp"
    reports.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(reports))
    with pytest.raises(SystemExit) as exc:
        launch(functools.partial(dist_fns.rank_one_usage_error, out=str(tmp_path)), cfg2(dist_timeout=30))
    assert exc.value.code == 2
    assert list(reports.iterdir()) == []


def test_env_seeds_distinct_per_rank(tmp_path):
    launch(functools.partial(dist_fns.env_seeds, out=str(tmp_path)), cfg2())
    r0, r1 = _results(tmp_path)
    assert (r0["seed"], r1["seed"]) == (1, 10_001)
    assert not torch.allclose(r0["obs"], r1["obs"])  # different seeds, different starts
    assert not torch.allclose(r0["obs"][0], r0["obs"][1])  # envs of one rank differ too


def test_evaluation_with_fewer_episodes_than_ranks_keeps_every_rank_in_step(tmp_path):
    launch(functools.partial(dist_fns.evaluate_fewer_episodes_than_ranks, out=str(tmp_path)), cfg2())
    r0, r1 = _results(tmp_path)
    assert r0["summary"] == r1["summary"] and r0["summary"]["episodes"] == 1
    assert r0["summary"]["return_mean"] >= 1  # CartPole pays 1 per step: the episode really ran
    assert r0["after"] == r1["after"] == 2


def test_evaluation_summary_keeps_the_worst_and_best_episode():
    from ddprl.evaluate import summarize

    records = [{"return": r, "length": 500.0} for r in (975.0, 980.0, 3.0, 972.0)]
    out = summarize(records)
    assert (out["return_min"], out["return_max"]) == (3.0, 980.0)
    assert out["return_mean"] == 732.5 and out["episodes"] == 4
    assert "length_min" not in out  # only the return: the rest stays as it was


def test_running_stats_identical_across_ranks_and_exact(tmp_path):
    launch(functools.partial(dist_fns.rms_update, out=str(tmp_path)), cfg2())
    r0, r1 = _results(tmp_path)
    for k in r0:
        assert torch.equal(r0[k], r1[k])
    g = torch.Generator().manual_seed(0)
    data = torch.randn(2, 50, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + 2.0
    everything = torch.cat([data.reshape(-1, 3), data.reshape(-1, 3) * 2]).double()
    assert torch.allclose(r0["mean"], everything.mean(0), atol=1e-9)
    assert torch.allclose(r0["var"], everything.var(0, unbiased=False), atol=1e-9)
    assert r0["count"].item() == 200


def test_exit_process_after_a_process_group_flushes_and_keeps_the_code(tmp_path):
    """A rank that joined a process group leaves with os._exit (gloo threads may outlive it):
    output still arrives."""
    code = (
        "import logging, sys\n"
        "from ddprl import runtime\n"
        "from ddprl.runtime import collectives\n"
        f"logging.basicConfig(filename={str(tmp_path / 'log.txt')!r}, level=logging.INFO)\n"
        "logging.getLogger('ddprl').info('logged line')\n"
        "collectives._group_joined = True\n"
        "print('unflushed text', end='')\n"
        "runtime.exit_process(3)\n"
        "print('never reached')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3
    assert out.stdout == "unflushed text"
    assert "logged line" in (tmp_path / "log.txt").read_text()
