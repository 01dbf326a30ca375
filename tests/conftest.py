"""Shared test helpers: run the real CLI in a subprocess, with bounded time; and the rule that
every test not marked ``gpu`` runs on the CPU, whatever devices the machine has."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# The JAX engine's tests run on simulated CPU devices; JAX reads this at its first import (and
# the CLI subprocesses inherit it). Nothing else reads it.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs shared between the tests' processes (many compile the same small PPO).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "ddprl-tests-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")


# A TD-MPC2 small enough for a CPU test (model_size 1's structure, tiny widths and plans).
# Tiny PPO on gymnax CartPole on the JAX engine: 8 envs x 32 steps, 256 global steps per iteration.
JAX_TINY = [
    "engine=jax",
    "task=gymnax/CartPole-v1",
    "devices=1",
    "num_envs=8",
    "n_steps=32",
    "batch_size=64",
    "epochs=2",
    "progress=false",
]
TDMPC2_TINY = [
    "model_size=1",
    "enc_dim=32",
    "mlp_dim=32",
    "latent_dim=16",
    "num_q=3",
    "num_samples=32",
    "num_elites=4",
    "num_pi_trajs=4",
    "iterations=2",
    "batch_size=16",
]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MUJOCO_GL", "disable")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def run_cli(
    args: list[str],
    cwd: Path | str | None = None,
    timeout: float = 300,
    launcher: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``python -m ddprl ARGS`` (or ``LAUNCHER -m ddprl ARGS``) in ``env`` (default: ``cli_env()``); killed after
    ``timeout``."""
    cmd = (launcher or [sys.executable]) + ["-m", "ddprl", *args]
    return subprocess.run(cmd, cwd=cwd, env=env or cli_env(), capture_output=True, text=True, timeout=timeout)


def start_job(
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    launcher: list[str] | None = None,
    ignore_sigint: bool = False,
) -> subprocess.Popen:
    """``python -m ddprl ARGS`` running in its own session (so that cleanup can stop all of its
    processes), stdout and stderr piped; ``ignore_sigint``: as a job started with ``&`` from a script."""
    cmd = (launcher or [sys.executable]) + ["-m", "ddprl", *args]
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )


def stop_with_sigterm(job: subprocess.Popen, ready, timeout: float) -> str:
    """SIGTERM to ``job`` once ``ready()`` holds (failing if the job ends first or ``timeout`` passes); its stderr.
    The job is killed if it does not end by itself."""
    import time

    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"not ready within {timeout:.0f} s"
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)
        return job.communicate(timeout=120)[1]
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


@pytest.fixture
def cli():
    return run_cli


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The order the tests ran in, shown even under ``-q``: pytest-randomly shuffles it (a test that
    passes only after another is a bug), and its seed replays a failing order."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.has_plugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"tests ran in a random order: replay it with --randomly-seed={seed}")


# -- every test not marked gpu runs on the CPU -----------------------------------------------------------
#
# On a machine with one visible GPU, world_size=auto would mean one CUDA rank, and the 2-rank
# tests (device=auto) would be refused by placement (one rank per GPU). So the session sees no
# CUDA device, module fixtures included, and each test marked ``gpu`` sees the machine as it is.

# CUDA reads CUDA_VISIBLE_DEVICES once per process, when it first starts: start it here, before
# the session hides the devices, so that the gpu tests still find them.
torch.cuda.is_available()
_MACHINE = {
    "device_count": torch.cuda.device_count,
    "is_available": torch.cuda.is_available,
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
}


def hide_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA device from now on: for the code that runs in this process (torch's count and
    availability, which placement and ``world_size=auto`` read) and for every process it starts
    (the CLI, the spawned ranks, torchrun's workers: they inherit CUDA_VISIBLE_DEVICES)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def show_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's CUDA devices, as the session found them."""
    if _MACHINE["CUDA_VISIBLE_DEVICES"] is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", _MACHINE["CUDA_VISIBLE_DEVICES"])
    monkeypatch.setattr(torch.cuda, "device_count", _MACHINE["device_count"])
    monkeypatch.setattr(torch.cuda, "is_available", _MACHINE["is_available"])


@pytest.fixture(scope="session", autouse=True)
def _cpu_session():
    with pytest.MonkeyPatch.context() as monkeypatch:
        hide_cuda(monkeypatch)
        yield


@pytest.fixture(autouse=True)
def _environ_as_found() -> Iterator[None]:
    """Each test leaves os.environ as it found it. Code run in the pytest process sets variables
    that every later test's subprocesses would inherit (ddprl/video.py's headless MUJOCO_GL=egl
    and SDL_* defaults, an nccl_preset's NCCL_* variables), so a test's outcome would depend on
    the tests that ran before it."""
    before = dict(os.environ)
    yield
    for key in os.environ.keys() - before.keys():
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def _cuda_for_gpu_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("gpu") is not None:
        show_cuda(monkeypatch)


# -- a small disk, to fill ----------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block; unmounted whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a small full disk) needs root")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)  # still busy: detach it


def resize(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no room left; returns it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler


# Two hosts on one machine (network namespaces) for the multi-node tests; see hosts.py.
from hosts import two_hosts  # noqa: E402,F401
