"""Shared test helpers: run the real CLI in a subprocess, with bounded time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The JAX engine's tests run on simulated CPU devices; JAX reads this at its first import (and
# the CLI subprocesses inherit it). Nothing else reads it.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs shared between the tests' processes (many compile the same small PPO).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "ddprl-tests-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MUJOCO_GL", "disable")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def run_cli(args: list[str], cwd: Path | str | None = None, timeout: float = 300,
            launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m ddprl ARGS`` (or ``LAUNCHER -m ddprl ARGS``); killed after ``timeout``."""
    cmd = (launcher or [sys.executable]) + ["-m", "ddprl", *args]
    return subprocess.run(cmd, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


# Two hosts on one machine (network namespaces) for the multi-node tests; see hosts.py.
from hosts import two_hosts  # noqa: E402,F401
