"""The job contract every algorithm plugs into: registry, config split, collective save/resume,
seeding owned by the runtime, torch feature detection."""

from __future__ import annotations

import ast
import functools
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import dist_fns
import pytest
import torch
from conftest import REPO, cli_env

from ddprl import registry
from ddprl.checkpoint import FORMAT_VERSION, Checkpointer, load_checkpoint
from ddprl.cli import main
from ddprl.config import load_config, public_fields
from ddprl.config.schema import JobConfig, RLConfig, key
from ddprl.errors import UsageError
from ddprl.metrics import MetricsLogger, read_metrics
from ddprl.prepare import prepare_train
from ddprl.run import Run
from ddprl.runtime import launch, resolve_world_size
from ddprl.runtime.seeding import Seeds, derive_seed

FAST = ["n_steps=64", "batch_size=64", "epochs=2", "progress=false", "dist_timeout=120", "device=cpu"]


# -- any supported torch: DDP keywords by feature detection ------------------------------------


def test_old_ddp_signature_wraps_and_broadcasts_buffers(tmp_path):
    """torch < 2.13 has no ``forward_sync_buffers``: wrap must not pass it, and must broadcast
    the buffers itself (``broadcast_buffers=False`` skips them at construction there)."""
    cfg = load_config(["world_size=2", "dist_timeout=60", "device=cpu"])
    launch(functools.partial(dist_fns.wrap_with_old_ddp, out=str(tmp_path)), cfg)
    for r in (0, 1):
        result = torch.load(tmp_path / f"rank{r}.pt")
        assert result["kwargs"] == {"broadcast_buffers": False}
        assert torch.equal(result["buffer"], torch.zeros(3))  # rank 0's buffer on both ranks


# -- world_size=auto, one TD-MPC2 env per rank ---------------------------------------------------


def test_world_size_auto():
    assert resolve_world_size("auto", "auto", cuda_count=0, cores=2) == 2  # CPU: two processes
    assert resolve_world_size("auto", "auto", cuda_count=0, cores=1) == 1  # one core: two ranks would lose
    assert resolve_world_size("auto", "cpu", nnodes=2, cuda_count=0, cores=64) == 4
    assert resolve_world_size("auto", "cuda", cuda_count=1) == 1  # one GPU: one rank
    assert resolve_world_size("auto", "auto", nnodes=2, cuda_count=8) == 16
    assert resolve_world_size(3, "cuda", cuda_count=1) == 3  # explicit values keep today's checks
    with pytest.raises(UsageError, match="no CUDA device"):
        resolve_world_size("auto", "cuda", cuda_count=0)
    assert load_config([]).world_size == "auto"
    assert prepare_train([], None).world_size == 2  # a test not marked gpu sees no GPU (tests/conftest.py)


def test_tdmpc2_one_env_per_rank_by_default():
    pytest.importorskip("dm_control")
    cfg = prepare_train(["algo=tdmpc2", "task=cartpole-balance", "world_size=2"], None)
    assert (cfg.world_size, cfg.num_envs) == (2, 2)
    with pytest.raises(UsageError, match="not divisible"):  # an explicit num_envs is still checked
        prepare_train(["algo=tdmpc2", "task=cartpole-balance", "world_size=2", "num_envs=3"], None)


# -- a resumed run never replays the start-of-run seeds -------------------------------------------


def test_seeds_fresh_and_resumed():
    s = Seeds(seed=1, rank=1)
    assert (s.env(), s.torch()) == (10_001, 2)
    resumed = {Seeds(1, r).env(step) for r in range(4) for step in (512, 1024, 10**9)}
    assert len(resumed) == 12  # distinct per rank and step
    assert all(seed >= 2**30 for seed in resumed)  # never a fresh run's seed + env index
    assert Seeds(1, 0).shared(512) == Seeds(1, 3).shared(512)  # shared streams agree on all ranks


def test_a_saved_rng_state_replays_torch_numpy_and_python_draws():
    """What a checkpoint keeps of a rank's generators (through the weights_only round trip a
    checkpoint takes) replays the same draws, mid-stream: numpy's position and its cached normal too."""
    import random

    import numpy as np

    from ddprl.checkpoint import rng_state, set_rng_state

    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    np.random.rand(7), np.random.standard_normal(), torch.rand(5), random.random()  # mid-stream, a normal cached
    buffer = io.BytesIO()
    torch.save(rng_state(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    def draws():
        return torch.rand(4).tolist(), np.random.rand(4).tolist(), np.random.standard_normal(), random.random()

    first = draws()
    set_rng_state(state)
    assert draws() == first


def test_derived_seeds_never_repeat_across_seeds_ranks_purposes_and_steps():
    """A resumed stream's seed is a hash of (seed, rank, purpose, step): two of them never coincide
    on a grid with seeds and steps 64 apart and steps past 2^32 (480 values in a range of 2^30: a
    chance collision has odds of about 1 in 10,000, and this grid has none)."""
    seeds = (1, 2, 3, 65, 129)
    steps = (64, 128, 192, 4096, 8192, 10**6, 10**9, 2**32 + 64, 2**32 + 128, 3 * 2**32 + 64, 777, 778)
    grid = [(s, r, p, t) for s in seeds for r in range(2) for p in ("env", "torch", "shared", "eval") for t in steps]
    derived = {derive_seed(*key) for key in grid}
    assert len(derived) == len(grid) == 480
    assert all(2**30 <= d < 2**31 for d in derived)


def test_evaluation_episodes_are_a_runs_own_and_the_same_at_every_evaluation():
    """Eval env ``i`` of a rank is seeded ``eval_env() + i``: runs of different seeds (consecutive, as
    a results row's are) and different ranks never share an evaluation episode's seed, and never a
    fresh training env's."""
    envs = 8
    sets = {
        (seed, rank): {Seeds(seed, rank).eval_env() + i for i in range(envs)} for seed in range(10) for rank in range(4)
    }
    every = set().union(*sets.values())
    assert len(every) == len(sets) * envs  # pairwise disjoint
    assert Seeds(2, 1).eval_env() == Seeds(2, 1).eval_env()  # the same episodes at every evaluation
    training = {Seeds(seed, rank).env() + i for seed in range(10) for rank in range(4) for i in range(envs)}
    assert not every & training
    assert all(seed + envs < 2**32 for seed in every)  # dm_control seeds a uint32


def _record_env_seeds(monkeypatch, module: str, name: str) -> list[int]:
    import importlib

    mod = importlib.import_module(module)
    original, seeds = getattr(mod, name), []

    def recording(*args, **kwargs):
        seeds.append(kwargs["seed"])
        return original(*args, **kwargs)

    monkeypatch.setattr(mod, name, recording)
    return seeds


def test_tdmpc2_resume_reseeds_envs(tmp_path, monkeypatch):
    """TD-MPC2 (DMC keeps no env state): the resumed envs are seeded from the resume step."""
    pytest.importorskip("dm_control")
    seeds = _record_env_seeds(monkeypatch, "ddprl.algos.tdmpc2.loop", "make_tdmpc2_env")
    common = [
        "train",
        "algo=tdmpc2",
        "task=cartpole-balance",
        "world_size=1",
        "episode_length=50",
        "seed_steps=100",
        "eval_episodes=0",
        "checkpoint_freq=100",
        "log_freq=100",
        "model_size=1",
        "enc_dim=16",
        "mlp_dim=16",
        "latent_dim=16",
        "num_q=2",
        "batch_size=8",
        "mpc=false",
        f"run_dir={tmp_path / 'r'}",
        "progress=false",
        "device=cpu",
    ]
    assert main(common + ["steps=100"]) == 0
    assert main(common + ["steps=150", "resume=auto"]) == 0
    assert seeds[0] == 1 and seeds[1] not in (1, 0) and seeds[1] == Seeds(1, 0).env(100)


def test_ppo_on_dmc_resume_reseeds_envs(tmp_path, monkeypatch):
    pytest.importorskip("dm_control")
    seeds = _record_env_seeds(monkeypatch, "ddprl.algos.ppo.loop", "make_env")
    common = [
        "train",
        "task=cartpole-balance",
        "world_size=1",
        "num_envs=2",
        "n_steps=32",
        "batch_size=32",
        "epochs=1",
        "eval_episodes=0",
        "checkpoint_freq=64",
        f"run_dir={tmp_path / 'r'}",
        "progress=false",
        "device=cpu",
    ]
    assert main(common + ["steps=64"]) == 0
    assert main(common + ["steps=128", "resume=auto"]) == 0
    assert seeds == [1, Seeds(1, 0).env(64)]


# -- metrics stay monotone after a resume ----------------------------------------------------------


def test_resumed_logger_goes_on_from_the_last_kept_rows_clock(tmp_path):
    """A job stopped after an hour and resumed: its wall_time goes on from the row at the
    checkpoint (3600 s), not from 0, and a dropped row's later time does not count."""
    rows = [{"step": 100, "wall_time": 1800.0}, {"step": 200, "wall_time": 3600.0}, {"step": 300, "wall_time": 5400.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    resumed = MetricsLogger(
        tmp_path, load_config(["progress=false"]), True, total_steps=500, start_step=200, resumed=True
    )
    resumed.log(300, {"train/loss": 1.0})
    resumed.close()
    walls = [r["wall_time"] for r in read_metrics(tmp_path)]
    assert walls[:2] == [1800.0, 3600.0] and 3600.0 <= walls[2] < 3660.0


def tensorboard_losses(tb_dir: Path) -> list[tuple[int, float]]:
    """``train/loss`` as TensorBoard reads the event files of ``tb_dir``: (step, value) in its order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


def test_resumed_logger_drops_rows_and_events_past_the_checkpoint(tmp_path):
    cfg = load_config(["progress=false"])
    first = MetricsLogger(tmp_path, cfg, is_main=True, total_steps=500)
    for step in (100, 200, 300, 400, 500):
        first.log(step, {"train/loss": float(step)})
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6')  # a line cut short by kill -9
    resumed = MetricsLogger(tmp_path, cfg, is_main=True, total_steps=500, start_step=300, resumed=True)
    resumed.log(400, {"train/loss": -400.0})
    resumed.close()
    assert [(r["step"], r["train/loss"]) for r in read_metrics(tmp_path)] == [
        (100, 100.0),
        (200, 200.0),
        (300, 300.0),
        (400, -400.0),
    ]
    assert tensorboard_losses(tmp_path / "tb") == [(100, 100.0), (200, 200.0), (300, 300.0), (400, -400.0)]


def test_resumed_logger_purges_event_files_named_in_one_second(tmp_path, monkeypatch):
    """Two event files of one second and one process are named .9 and .10, which TensorBoard reads
    in that text order (.10 first): the resumed sitting's file must still be read last."""
    from tensorboard.summary.writer import event_file_writer

    clock = [float(int(time.time())) + 0.5]  # stays in one second unless the logger waits

    def sleep(seconds):
        clock[0] += seconds

    fake_time = SimpleNamespace(time=lambda: clock[0], sleep=sleep)
    monkeypatch.setattr(event_file_writer, "time", fake_time)
    monkeypatch.setattr("ddprl.metrics.time", fake_time)
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    cfg = load_config(["progress=false"])
    first = MetricsLogger(tmp_path, cfg, is_main=True, total_steps=500)
    for step in (100, 200, 300, 400, 500):
        first.log(step, {"train/loss": float(step)})
    first.close()
    resumed = MetricsLogger(tmp_path, cfg, is_main=True, total_steps=500, start_step=300, resumed=True)
    resumed.log(400, {"train/loss": -400.0})
    resumed.close()
    names = sorted(p.name for p in (tmp_path / "tb").iterdir())
    assert [n.rsplit(".", 1)[1] for n in names] == ["9", "10"]  # read in creation order
    assert tensorboard_losses(tmp_path / "tb") == [(100, 100.0), (200, 200.0), (300, 300.0), (400, -400.0)]


# -- checkpoints are pruned, latest and best are kept ----------------------------------------------


def test_a_resume_drops_the_step_checkpoints_past_its_step(tmp_path):
    files = Checkpointer(tmp_path)
    files.dir.mkdir()
    for step in (100, 200, 300, 400):
        (files.dir / f"step_{step}.pt").write_bytes(b"x")
    dropped = files.drop_after(200)
    assert sorted(p.name for p in dropped) == ["step_300.pt", "step_400.pt"]
    assert sorted(p.name for p in files.dir.iterdir()) == ["step_100.pt", "step_200.pt"]


def test_keep_last_prunes_step_checkpoints(tmp_path):
    run_dir = tmp_path / "k"
    args = [
        "train",
        "world_size=1",
        "num_envs=2",
        "steps=1024",
        "checkpoint_freq=128",
        "eval_freq=512",
        "eval_episodes=2",
        "keep_last=2",
        f"run_dir={run_dir}",
        *FAST,
    ]
    assert main(args) == 0
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["best.pt", "latest.pt", "step_1024.pt", "step_896.pt"]
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    evals = {r["step"]: r["eval/return_mean"] for r in read_metrics(run_dir) if "eval/return_mean" in r}
    assert best["step"] == max(evals, key=lambda s: (evals[s], -s)) and best["best"]["score"] == max(evals.values())
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"] == 1024


def test_keep_last_zero_keeps_all(tmp_path):
    rt = SimpleNamespace(is_main=True, world_size=1, all_gather_object=lambda obj: [obj])
    ckpt = Checkpointer(tmp_path, keep_last=0)
    for step in (1, 2, 3, 4):
        ckpt.save(rt, step, {"step": step}, {})
    assert [n for n, _ in ckpt.step_files()] == [1, 2, 3, 4]
    ckpt.keep_last = 1
    ckpt.save(rt, 5, {"step": 5}, {})
    assert [n for n, _ in ckpt.step_files()] == [5]


# -- collective save/resume in one place ------------------------------------------------------------


def test_older_format_refused_naming_both_versions(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"format_version": FORMAT_VERSION - 1, "algo": "ppo"}, path)
    with pytest.raises(
        UsageError,
        match=rf"format_version {FORMAT_VERSION - 1}; this ddprl reads format_version "
        rf"{FORMAT_VERSION}",
    ):
        load_checkpoint(path)


def test_checkpoint_read_once_per_process(tmp_path, monkeypatch):
    run_dir = tmp_path / "once"
    args = ["train", "world_size=1", "num_envs=2", "steps=128", "eval_episodes=0", f"run_dir={run_dir}", *FAST]
    assert main(args) == 0
    reads = []
    original = torch.load

    def counting(f, *a, **kw):
        reads.append(str(f))
        return original(f, *a, **kw)

    monkeypatch.setattr(torch, "load", counting)
    assert main(args + ["steps=256", "resume=auto"]) == 0
    assert [r for r in reads if r.endswith("latest.pt")] == [str(run_dir / "checkpoints" / "latest.pt")]


def test_other_world_size_resets_own_state_in_one_line(tmp_path, caplog):
    rt = SimpleNamespace(rank=0, world_size=1, seeds=lambda seed: Seeds(seed, 0))
    checkpoint = {
        "format_version": FORMAT_VERSION,
        "algo": "ppo",
        "step": 64,
        "world_size": 2,
        "config": {},
        "counters": {},
        "best": None,
        "state": {"model": {}, "optimizer": {}},
        "ranks": [{"rng": None, "env": None}, {"rng": None, "env": None}],
    }
    torch.save(checkpoint, tmp_path / "c.pt")
    cfg = load_config(["world_size=1", f"resume={tmp_path / 'c.pt'}"])
    messages = []
    import logging

    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("ddprl").addHandler(handler)
    try:
        run = Run(rt, cfg)
        assert run.restore_rank_state() is None
    finally:
        logging.getLogger("ddprl").removeHandler(handler)
    assert len(messages) == 1
    assert "2-rank checkpoint on 1 rank(s)" in messages[0] and "reset each rank's own state (env, rng)" in messages[0]
    assert run.env_seed == Seeds(1, 0).env(64)


# -- kill -9 of the whole job, then resume=auto ----------------------------------------------------------


@pytest.mark.slow
def test_kill_9_then_resume_auto(tmp_path):
    run_dir = tmp_path / "k9"
    args = [
        sys.executable,
        "-m",
        "ddprl",
        "train",
        "world_size=2",
        "steps=1000000",
        "checkpoint_freq=4096",
        "eval_freq=0",
        "eval_episodes=0",
        f"run_dir={run_dir}",
        "resume=auto",
        *FAST,
    ]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            steps = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*.pt"))
            # kill early in a checkpoint interval (rows of 1-2 of its 8 iterations written): the
            # next checkpoint is 6 iterations away, so the kill cannot land just after it
            if (
                len(steps) >= 2
                and (run_dir / "metrics.jsonl").exists()
                and steps[-1] < read_metrics(run_dir)[-1]["step"] <= steps[-1] + 1024
            ):
                break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job: launcher and both ranks
    finally:
        proc.kill()
        proc.wait(timeout=60)
    saved = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"]
    assert saved >= 2048
    before = read_metrics(run_dir)
    assert before[-1]["step"] > saved  # rows past the checkpoint exist before the resume
    resumed = subprocess.run(
        args[:5] + [f"steps={saved + 2048}"] + args[6:],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == saved + 2048  # strictly increasing
    assert steps[steps.index(saved) + 1] == saved + 512  # the resumed rows follow the checkpoint
    final = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert final["counters"]["iteration"] == (saved + 2048) // 512
    # the same world: every rank continued its own env state and RNG (no seed replayed)
    assert "reset each rank's own state" not in resumed.stderr


# -- the registry: an algorithm declared here, nowhere else ---------------------------------------------


@dataclass(kw_only=True)
class ToyConfig(RLConfig):
    lr: float = key("learning rate of the toy policy", 0.05)


@dataclass(kw_only=True)
class ToyFitConfig(JobConfig):
    epochs: int = key("passes over the toy data", 3)


def toy_train(rt, cfg):
    """A linear policy on CartPole, pushed towards action 1: small, but the whole contract."""
    from ddprl.envs import make_env

    run = Run(rt, cfg)
    env = make_env(cfg.task, cfg.local_num_envs(rt.world_size), seed=run.env_seed)
    policy = torch.nn.Linear(4, 2)
    if run.resumed:
        policy.load_state_dict(run.state["model"])
    model = rt.wrap(policy)
    optim = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    run.restore_rank_state()
    run.open(total_steps=cfg.steps)
    obs, step = env.reset(), run.step
    while step < cfg.steps:
        loss = torch.nn.functional.cross_entropy(model(obs), torch.ones(len(obs), dtype=torch.long))
        optim.zero_grad()
        loss.backward()
        optim.step()
        obs = env.step(rt.unwrap(model)(obs).argmax(-1))[0]
        step += cfg.num_envs
        run.log(step, {"train/loss": rt.all_reduce_mean(float(loss.detach()))})
    run.save(step, {"model": rt.unwrap(model).state_dict()})
    run.close()


def toy_actor(cfg, state, device):
    from ddprl.envs import make_env
    from ddprl.evaluate import Actor

    policy = torch.nn.Linear(4, 2)
    policy.load_state_dict(state["model"])
    return Actor(lambda n, seed: make_env(cfg.task, n, seed=seed), lambda obs: policy(obs).argmax(-1))


def toy_fit(rt, cfg):
    """A job without task or environments (the shape of a supervised one)."""
    run = Run(rt, cfg, score_mode="min")
    model = rt.wrap(torch.nn.Linear(1, 1))
    run.open(total_steps=cfg.epochs)
    x = torch.linspace(-1, 1, 8).unsqueeze(1)
    for epoch in range(1, cfg.epochs + 1):
        loss = ((model(x) - 3 * x) ** 2).mean()
        loss.backward()
        run.log(epoch, {"train/loss": rt.all_reduce_mean(float(loss.detach()))})
    run.save(cfg.epochs, {"model": rt.unwrap(model).state_dict()}, score=float(loss.detach()))
    run.close()


@pytest.fixture
def toy_algorithms():
    registry.register(
        registry.Algorithm(
            name="toy",
            config=ToyConfig,
            train=toy_train,
            load_actor=toy_actor,
            defaults={
                "task": "CartPole-v1",
                "steps": 64,
                "num_envs": 2,
                "eval_freq": 0,
                "eval_episodes": 2,
                "checkpoint_freq": 0,
            },
            architecture_keys=(),
            description="a test's algorithm",
        )
    )
    registry.register(registry.Algorithm(name="toyfit", config=ToyFitConfig, train=toy_fit))
    yield
    registry._REGISTRY.pop(("toy", "torch"))
    registry._REGISTRY.pop(("toyfit", "torch"))


def test_algorithm_declared_in_a_test_is_trainable_evaluable_and_listed(tmp_path, capsys, toy_algorithms):
    assert main(["keys"]) == 0
    assert "toy " in capsys.readouterr().out
    assert main(["keys", "algo=toy"]) == 0
    out = capsys.readouterr().out
    assert "learning rate of the toy policy" in out and "environments in the whole job" in out
    for world_size in (1, 2):
        run_dir = tmp_path / f"toy{world_size}"
        assert (
            main(
                [
                    "train",
                    "algo=toy",
                    f"world_size={world_size}",
                    f"run_dir={run_dir}",
                    "progress=false",
                    "device=cpu",
                    "dist_timeout=60",
                ]
            )
            == 0
        )
        assert read_metrics(run_dir)[-1]["step"] == 64
    assert main(["eval", f"checkpoint={tmp_path / 'toy2' / 'checkpoints' / 'latest.pt'}", "episodes=2"]) == 0
    assert "episodes=2" in capsys.readouterr().out


def test_job_without_task_or_envs(tmp_path, monkeypatch, toy_algorithms):
    with pytest.raises(UsageError, match="unknown key 'task'"):
        load_config(["algo=toyfit", "task=CartPole-v1"])
    cfg = load_config(["algo=toyfit"])
    assert not hasattr(cfg, "num_envs") and not hasattr(cfg, "task")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "algo=toyfit", "world_size=1", "progress=false", "device=cpu"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("toyfit-")
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.pt", "latest.pt", "step_3.pt"]


def test_every_key_has_one_line_of_help():
    for name in registry.names():
        for f in public_fields(registry.get(name).config):
            help_ = f.metadata.get("help", "")
            assert help_ and "\n" not in help_, (name, f.name)


# -- only ddprl.runtime imports torch.distributed --------------------------------------------------------


def test_only_the_runtime_imports_torch_distributed():
    offenders = []
    for path in (REPO / "ddprl").rglob("*.py"):
        if "runtime" in path.relative_to(REPO / "ddprl").parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Attribute) and ast.unparse(node).startswith("torch.distributed"):
                names = [ast.unparse(node)]
            if any(n.startswith(("torch.distributed", "torch.nn.parallel", "torch.multiprocessing")) for n in names):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_the_library_never_imports_its_command_line():
    """The command line sits on top: ddprl's modules (the supervised Trainer included) reach the
    shared preparation in ddprl.prepare, never ddprl.cli (only the entry point imports it)."""
    package = Path(registry.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name in ("cli.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.relative_to(package)}:{node.lineno}" for n in names if n == "ddprl.cli"]
    assert offenders == []
