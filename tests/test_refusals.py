"""Bad input found before anything runs: one line ``ddprl: error: ...``, exit code 2, nothing written,
where the check would otherwise come after work that takes minutes or fails with a traceback."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest
import torch
from conftest import cli_env, run_cli

from ddprl.cli import main


@pytest.mark.parametrize("world_size", [[], ["world_size=2"]])
def test_cuda_without_a_gpu_is_refused_before_autoscale_reads_its_memory(tmp_path, monkeypatch, capsys, world_size):
    def no_cuda(*args, **kwargs):
        raise AssertionError("Torch not compiled with CUDA enabled")  # what a CPU build of torch raises

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_cuda)
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--config-name", "snake_base", "device=cuda", "autoscale=true", *world_size])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "ddprl: error: device=cuda but no CUDA device is visible (check CUDA_VISIBLE_DEVICES); use device=cpu"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def dmc_run(tmp_path_factory):
    """A PPO checkpoint of a DeepMind Control task, trained for a few steps."""
    root = tmp_path_factory.mktemp("dmc")
    args = ["train", "task=cartpole-balance", "world_size=1", "num_envs=2", "n_steps=16", "batch_size=32"]
    args += ["epochs=1", "steps=32", "eval_episodes=0", "hidden_sizes=[8]", "progress=false", f"run_dir={root / 'run'}"]
    res = run_cli(args, cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "run"


def _ddprl(args: list[str], cwd, mujoco_gl: str, before: str = "") -> subprocess.CompletedProcess:
    """``ddprl ARGS`` in a process with MUJOCO_GL=mujoco_gl, after the Python code ``before``."""
    code = f"{before}\nfrom ddprl.cli import entry\nentry()\n"
    env = {**cli_env(), "MUJOCO_GL": mujoco_gl}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _one_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("ddprl: checkpoint "), res.stderr[-3000:]
    assert lines[1].startswith("ddprl: error: "), lines
    return lines[1]


def test_eval_video_that_cannot_be_drawn_is_refused_before_any_episode(dmc_run, tmp_path):
    # Any step of a DMC env is an episode under way: evaluating would take minutes before the video.
    stepped = (
        "from ddprl.envs.dmc import DMCVecEnv\n"
        "def step(self, action):\n"
        "    raise RuntimeError('an env stepped before the video was found impossible')\n"
        "DMCVecEnv.step = step\n"
    )
    gif = tmp_path / "x.gif"
    res = _ddprl(["eval", f"checkpoint={dmc_run}", f"video={gif}"], tmp_path, "disable", before=stepped)
    line = _one_error(res)
    assert line.startswith("ddprl: error: cannot render cartpole-balance with MUJOCO_GL=disable"), line
    assert "set MUJOCO_GL=egl" in line and not gif.exists()


@pytest.mark.skipif(ctypes.util.find_library("OSMesa") is not None, reason="OSMesa is installed here")
@pytest.mark.parametrize("command", ["eval", "play"])
def test_mujoco_gl_backend_that_is_not_installed_is_one_line(dmc_run, tmp_path, command):
    gif = tmp_path / "x.gif"
    res = _ddprl([command, f"checkpoint={dmc_run}", f"video={gif}"], tmp_path, "osmesa")
    line = _one_error(res)
    assert line.startswith("ddprl: error: MUJOCO_GL=osmesa: mujoco cannot load this OpenGL backend"), line
    assert "install OSMesa" in line and "MUJOCO_GL=egl" in line
    assert os.listdir(tmp_path) == []


def _needs_box2d(**kwargs):
    import gymnasium as gym

    raise gym.error.DependencyNotInstalled('Box2D is not installed, run `pip install "gymnasium[box2d]"`')


def test_a_gymnasium_task_whose_package_is_missing_is_one_line(tmp_path, monkeypatch, capsys):
    """Gymnasium's DependencyNotInstalled (LunarLander without Box2D) is the user's to act on: one line, exit 2.
    The task stands in for one whose package is missing (registered here, it raises as Gymnasium's Box2D tasks do)."""
    import gymnasium as gym

    gym.register("DdprlNeedsBox2D-v0", entry_point=_needs_box2d)
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["train", "task=DdprlNeedsBox2D-v0", "world_size=1"])
    finally:
        del gym.registry["DdprlNeedsBox2D-v0"]
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "ddprl: error: task=DdprlNeedsBox2D-v0 needs a package that is not installed: Box2D is not installed, "
        'run `pip install "gymnasium[box2d]"`'
    ]
    assert not (tmp_path / "runs").exists()
