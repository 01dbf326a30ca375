"""Preemption-safe jobs: a signal to the launcher or to one rank ends the job at a step boundary
with one collective checkpoint and exit code 75; ``resume=auto`` then goes on without losing or
repeating a step. torchrun's elastic restart after a worker is SIGKILLed completes the job.

Real processes, real signals, real gloo; each job is small (2 ranks on the CPU).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import JAX_TINY, TDMPC2_TINY, cli_env, run_cli
from conftest import start_job as start

from ddprl.checkpoint import Checkpointer, load_checkpoint, resolve_resume, save_atomically
from ddprl.metrics import read_metrics
from ddprl.runtime import free_port
from ddprl.runtime.preemption import PREEMPTED_EXIT_CODE, StopCheck

PPO = [
    "device=cpu",
    "compile=false",  # eager, as these runs are short whatever their budget
    "n_steps=64",
    "batch_size=64",
    "epochs=2",
    "progress=false",
    "eval_episodes=0",
    "checkpoint_freq=0",
    "dist_timeout=120",
]  # 2 ranks x 4 envs: 512 global steps per iteration
QMIX = [
    "task=Foraging-8x8-2p-2f-coop-v3",
    "algo=qmix",
    "device=cpu",
    "num_envs=4",
    "batch_size=4",
    "buffer_size=64",
    "update_every=100",
    "log_freq=4",
    "eval_episodes=0",
    "checkpoint_freq=0",
    "progress=false",
    "dist_timeout=120",
]  # 4 global steps per iteration, a row each
JAX = [*JAX_TINY, "eval_episodes=0", "checkpoint_freq=0", "dist_timeout=120"]


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()


def wait_for(condition, timeout: float, what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for p in procs:
            if p.poll() is not None:
                out, err = p.communicate()
                pytest.fail(f"job ended (exit {p.returncode}) while waiting for {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.2)


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return read_metrics(run_dir) if path.exists() else []


def finish(p: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def check_resumes_without_gaps(run_dir: Path, cwd: Path, extra: list[str], step_size: int, more: int) -> None:
    """The preempted job's checkpoint is at its last logged step; resume=auto continues from it with
    every row's step exactly one step after the previous (nothing lost, nothing repeated)."""
    ckpt = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert ckpt["step"] == rows(run_dir)[-1]["step"]  # saved at the step the job stopped
    total = ckpt["step"] + more * step_size
    res = run_cli(["train", *extra, f"steps={total}", "resume=auto", f"run_dir={run_dir}"], cwd=cwd, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [r["step"] for r in rows(run_dir)]
    assert steps[-1] >= total
    assert all(b - a == step_size for a, b in zip(steps, steps[1:], strict=False)), steps
    walls = [r["wall_time"] for r in rows(run_dir)]
    assert walls == sorted(walls), walls  # the resumed job's clock went on from the stopped one's


@pytest.mark.parametrize("algo", ["ppo", "qmix", "jax"])
@pytest.mark.slow
def test_sigterm_to_the_launcher_saves_at_the_step_and_resumes(tmp_path, algo):
    keys, step_size = {"ppo": (PPO, 512), "qmix": (QMIX, 4), "jax": (JAX, 256)}[algo]
    run_dir = tmp_path / "run"
    job = [*keys, "world_size=2", "steps=100000000", f"run_dir={run_dir}"]
    p = start(["train", *job], tmp_path)
    try:
        wait_for(lambda: len(rows(run_dir)) >= 3, 120, "metrics rows", [p])
        # a burst: the later signals arrive while the ranks agree and save; they must change nothing
        for _ in range(4):
            p.send_signal(signal.SIGTERM)
            time.sleep(0.05)
        sent = time.monotonic()
        code, err = finish(p)
        took = time.monotonic() - sent
    finally:
        stop_all([p])
    assert code == PREEMPTED_EXIT_CODE, err[-3000:]
    assert took < 30, f"the job took {took:.1f} s to stop"
    assert "stopped by SIGTERM" in err and "resume=auto" in err
    assert "Traceback" not in err, err[-3000:]
    check_resumes_without_gaps(run_dir, tmp_path, [*keys, "world_size=2"], step_size, more=3)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # ended meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_ranks_of_a_sigkilled_launcher_save_and_leave(tmp_path):
    """A launcher killed with SIGKILL (the OOM killer, kill -9) from a job started in the
    background, which ignores SIGINT: its ranks get SIGTERM, save at the step and end, and
    resume=auto goes on from there."""
    run_dir = tmp_path / "run"
    job = [*PPO, "world_size=2", "steps=100000000", f"run_dir={run_dir}"]
    p = start(["train", *job], tmp_path, ignore_sigint=True)
    try:
        wait_for(lambda: len(rows(run_dir)) >= 3, 120, "metrics rows", [p])
        ranks = [pid for pid in children(p.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(ranks) == 2, ranks
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in ranks), "the ranks went on without their launcher"
        _, err = p.communicate(timeout=30)  # the ranks held the launcher's stderr until they ended
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    assert "stopped by SIGTERM" in err, err[-3000:]
    check_resumes_without_gaps(run_dir, tmp_path, [*PPO, "world_size=2"], 512, more=2)


def slurm_env(rank: int, job_id: int) -> dict[str, str]:
    """The variables an `srun --ntasks=2` on one node gives task ``rank`` (rank 0's host: localhost)."""
    env = cli_env()
    for name in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    env.update(
        {
            "SLURM_JOB_ID": str(job_id),
            "SLURM_JOBID": str(job_id),
            "SLURM_STEP_ID": "0",
            "SLURM_STEPID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_NPROCS": "2",
            "SLURM_NNODES": "1",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_TASKS_PER_NODE": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2",
        }
    )
    return env


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank(tmp_path):
    """SLURM-style: each rank is its own process; only rank 1 is signalled (as one task's
    preemption notice would be): both ranks learn it, save together and exit 75."""
    run_dir = tmp_path / "run"
    job = ["train", *PPO, "steps=100000000", f"run_dir={run_dir}", f"master_port={free_port()}"]
    procs = [start(job, tmp_path, env=slurm_env(rank, job_id=4242)) for rank in (0, 1)]
    try:
        wait_for(lambda: len(rows(run_dir)) >= 3, 120, "metrics rows", procs)
        procs[1].send_signal(signal.SIGTERM)
        results = [finish(p) for p in procs]
    finally:
        stop_all(procs)
    assert [code for code, _ in results] == [PREEMPTED_EXIT_CODE] * 2, results[0][1][-2000:] + results[1][1][-2000:]
    assert "stopped by SIGTERM on rank 1" in results[0][1]
    check_resumes_without_gaps(run_dir, tmp_path, [*PPO, "world_size=2"], 512, more=2)


TDMPC2 = [
    "algo=tdmpc2",
    "task=cartpole-balance",
    *TDMPC2_TINY,
    "episode_length=50",
    "num_envs=2",
    "seed_steps=1000",
    "log_freq=100",
    "eval_episodes=0",
    "checkpoint_freq=0",
    "progress=false",
    "dist_timeout=120",
    "device=cpu",
]  # 2 ranks x 1 env: 2 global steps per agent step; random ones of <1 ms, then ~30 ms each


@pytest.mark.slow
def test_sigterm_right_after_tdmpc2_seeding_stops_within_a_few_steps(tmp_path):
    """Seeding's random steps cost <1 ms, so the stop check had stretched its window to ~1000
    steps; learning makes each step ~40x costlier. A signal sent as the first update row is
    logged must stop the job within a few steps, not at the end of that window (there: ~1700
    global steps, ~30 s later). Counted in steps, so a slow machine cannot make it pass."""
    run_dir = tmp_path / "run"
    p = start(["train", *TDMPC2, "world_size=2", "steps=100000000", f"run_dir={run_dir}"], tmp_path)
    try:
        wait_for(lambda: any(r.get("train/updates", 0) > 0 for r in rows(run_dir)), 180, "the first update", [p])
        learning_from = next(r["step"] for r in rows(run_dir) if r.get("train/updates", 0) > 0)
        p.send_signal(signal.SIGTERM)
        code, err = finish(p)
    finally:
        stop_all([p])
    assert code == PREEMPTED_EXIT_CODE, err[-3000:]
    stopped_at = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"]
    # ~1 s of steps (~30 agent steps) between reductions, plus the time to see the row and signal
    assert learning_from == 1000 and stopped_at - learning_from <= 400, (learning_from, stopped_at)


@pytest.mark.slow
def test_torchrun_restarts_workers_after_a_sigkill_and_completes(tmp_path):
    run_dir = tmp_path / "run"
    total = 512 * 60
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1"]
    p = start(
        ["train", *PPO, "checkpoint_freq=2048", f"steps={total}", "resume=auto", f"run_dir={run_dir}"],
        tmp_path,
        launcher=launcher,
    )
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest.pt").exists(), 120, "a checkpoint", [p])
        workers = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        assert len(workers) == 2, workers
        killed_at = rows(run_dir)[-1]["step"]
        os.kill(int(workers[1]), signal.SIGKILL)
        code, err = finish(p, timeout=300)
    finally:
        stop_all([p])
    assert code == 0, err[-3000:]
    steps = [r["step"] for r in rows(run_dir)]
    assert steps[-1] == total and killed_at < total
    assert all(b - a == 512 for a, b in zip(steps, steps[1:], strict=False)), (
        steps
    )  # monotone: the lost future was dropped
    assert err.count("parameters synchronised") == 2  # a second attempt of the whole group ran


# -- pieces -------------------------------------------------------------------------------------


class OneRank:
    """A runtime of one rank for StopCheck (its only verb)."""

    def __init__(self):
        self.gathers = 0

    def all_gather_object(self, obj):
        self.gathers += 1
        return [obj]


def test_stop_check_reduces_about_once_per_interval():
    rt = OneRank()
    check = StopCheck(rt, interval_s=0.05)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.5:
        assert not check()
        time.sleep(0.001)
    # ~10 reductions in 0.5 s of ~1 ms steps (not one per step: ~400 calls)
    assert 5 <= rt.gathers <= 25, rt.gathers
    assert check.every > 10


def test_stop_check_restarts_its_cadence_where_steps_turn_costlier():
    """Thousands of cheap steps stretch the window; restart() (every rank at the same step)
    makes the very next call reduce, and the window is then measured on the new steps."""
    rt = OneRank()
    check = StopCheck(rt, interval_s=0.05)
    for _ in range(5000):
        check()  # steps of microseconds
    assert check.every >= 1000
    check.restart()
    gathers = rt.gathers
    time.sleep(0.02)  # one costly step
    assert not check() and rt.gathers == gathers + 1
    assert check.every <= 4  # ~2 such steps per interval (not the thousands of the cheap ones)


def _checkpoint(path: Path, step: int) -> None:
    save_atomically(
        {
            "format_version": 2,
            "algo": "ppo",
            "step": step,
            "world_size": 1,
            "config": {},
            "counters": {},
            "state": {"w": torch.zeros(3)},
            "ranks": [],
            "best": None,
        },
        path,
    )


def test_resume_auto_skips_damaged_checkpoints(tmp_path, caplog):
    ckpts = Checkpointer(tmp_path)
    ckpts.dir.mkdir()
    for step in (100, 200, 300):
        _checkpoint(ckpts.dir / f"step_{step}.pt", step)
    os.link(ckpts.dir / "step_300.pt", ckpts.dir / "latest.pt")
    with open(ckpts.dir / "step_300.pt", "r+b") as f:  # latest.pt is the same file: both damaged
        f.truncate(100)
    (ckpts.dir / "step_200.pt").write_bytes(b"")
    with caplog.at_level("WARNING", logger="ddprl"):
        path = resolve_resume("auto", str(tmp_path), "ppo")
    assert path == (ckpts.dir / "step_100.pt").resolve()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and all(name in warnings[0] for name in ("latest.pt", "step_300.pt", "step_200.pt"))
    # the resumed run points latest.pt back at what it resumed
    ckpts.point_latest_at(path)
    assert load_checkpoint(ckpts.dir / "latest.pt")["step"] == 100


FAKE_SRUN = """#!/usr/bin/env bash
# srun on one node without SLURM: SLURM_NTASKS tasks with the variables srun gives them.
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 SLURM_STEP_ID=0 SLURM_STEPID=0 \\
    SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST SLURM_TASKS_PER_NODE=$SLURM_NTASKS \\
    SLURM_STEP_TASKS_PER_NODE=$SLURM_NTASKS "$@" &
    pids+=($!)
done
echo "${pids[@]}" > "$FAKE_SLURM_DIR/tasks"
code=0
for pid in "${pids[@]}"; do wait "$pid"; c=$?; (( c > code )) && code=$c; done
exit $code
"""


@pytest.mark.slow
def test_sbatch_script_requeues_after_the_signal_and_resumes(tmp_path):
    """scripts/slurm.sbatch with `srun`/`scontrol` stand-ins (no SLURM here: the only fakes): SIGUSR1
    to the tasks, as `--signal=USR1@180` sends it, ends in a requeue; the requeued job resumes."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(FAKE_SRUN)
    (fake / "scontrol").write_text(
        "#!/usr/bin/env bash\n"  # `show hostnames` of a one-host list; requeue recorded
        'if [ "$1" = show ]; then echo "$3"; else echo "$@" >> "$FAKE_SLURM_DIR/scontrol"; fi\n'
    )
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    port = free_port()
    while not 20000 <= port < 40000:
        port = free_port()
    job_id = str(port - 20000)  # ddprl's port under SLURM: 20000 + job id mod 20000
    env = cli_env()
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(
        {
            "PATH": f"{fake}:{env['PATH']}",
            "FAKE_SLURM_DIR": str(tmp_path),
            "PYTHON": sys.executable,
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NAME": "ppo",
            "SLURM_NTASKS": "2",
            "SLURM_NNODES": "1",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_NTASKS_PER_NODE": "2",
        }
    )
    script = [str(Path(__file__).resolve().parents[1] / "scripts" / "slurm.sbatch")]
    run_dir = tmp_path / "runs" / f"ppo-{job_id}"

    def sbatch(*keys: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["bash", *script, *PPO, *keys],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    job = sbatch("steps=100000000")
    try:
        wait_for(lambda: len(rows(run_dir)) >= 3 and (tmp_path / "tasks").exists(), 120, "metrics rows", [job])
        for pid in (tmp_path / "tasks").read_text().split():
            os.kill(int(pid), signal.SIGUSR1)
        out, err = job.communicate(timeout=120)
    finally:
        stop_all([job])
    assert job.returncode == 0, err[-3000:]
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", job_id]
    assert "stopped by SIGUSR1" in err
    stopped_at = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"]
    assert stopped_at == rows(run_dir)[-1]["step"]

    # The requeued job: the same script and job id, on more tasks (a requeue may get another node count).
    env.update({"SLURM_RESTART_COUNT": "1", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4"})
    requeued = sbatch(f"steps={stopped_at + 2 * 512}")
    try:
        out, err = requeued.communicate(timeout=300)
    finally:
        stop_all([requeued])
    assert requeued.returncode == 0, err[-3000:]
    steps = [r["step"] for r in rows(run_dir)]
    assert steps[-1] == stopped_at + 2 * 512
    assert all(b - a == 512 for a, b in zip(steps, steps[1:], strict=False)), steps
    assert "resuming a 2-rank run on 4 ranks: batch_size=64 -> 32 per rank" in err
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["world_size"] == 4
