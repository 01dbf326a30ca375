"""Snake with PPO end to end, play, autoscale and nccl_preset (CPU)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import run_cli

from ddprl.config import load_config
from ddprl.envs.snake import SnakeEnv
from ddprl.metrics import read_metrics
from ddprl.runtime import NCCL_PRESETS, apply_nccl_preset
from ddprl.system import autoscale_ppo

TINY = [
    "task=snake",
    "world_size=2",
    "num_envs=16",
    "n_steps=16",
    "batch_size=64",
    "epochs=1",
    "steps=512",
    "eval_episodes=2",
    "eval_freq=0",
    "progress=false",
    "dist_timeout=120",
    "policy=cnn",
    "policy_width=8",
    "hidden_sizes=[32]",
]


@pytest.mark.slow
def test_snake_ppo_two_ranks_then_play_and_eval(tmp_path):
    run_dir = tmp_path / "s"
    res = run_cli(["train", f"run_dir={run_dir}", *TINY], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    final = read_metrics(run_dir)[-1]
    assert final["step"] == 512 and "eval/score_mean" in final and "eval/length_mean" in final
    assert not any(k.startswith("system/") for k in final)  # no GPU: GPU metrics absent, not zero
    ckpt = run_dir / "checkpoints" / "latest.pt"
    gif = tmp_path / "snake.gif"
    play = run_cli(["play", f"checkpoint={ckpt}", f"video={gif}"], cwd=tmp_path)
    assert play.returncode == 0, play.stderr[-2000:]
    import imageio.v2 as imageio

    frames = imageio.mimread(gif)
    assert len(frames) >= 2 and frames[0].shape == (200, 200, 3)
    text = run_cli(["play", f"checkpoint={ckpt}", "fps=0", "episodes=2"], cwd=tmp_path)
    assert text.returncode == 0, text.stderr[-2000:]
    assert text.stdout.count("+----------+") >= 4  # frames of a 10x10 board were drawn
    assert len(re.findall(r"^return=-?[0-9.]+ length=\d+ score=\d+$", text.stdout, re.M)) == 2
    ev = run_cli(["eval", f"checkpoint={ckpt}", "episodes=3"], cwd=tmp_path)
    assert ev.returncode == 0 and re.search(r"score_mean=", ev.stdout), ev.stderr[-2000:]
    sampled = run_cli(["eval", f"checkpoint={ckpt}", "episodes=3", "deterministic=false"], cwd=tmp_path)
    assert sampled.returncode == 0 and "episodes=3" in sampled.stdout, sampled.stderr[-2000:]


def test_snake_state_dict_resumes_the_same_games():
    env = SnakeEnv(16, seed=3)
    env.reset()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        env.step(torch.randint(0, 4, (16,), generator=g))
    saved = env.state_dict()
    actions = torch.randint(0, 4, (30, 16), generator=g)
    first = [env.step(a)[0] for a in actions]
    other = SnakeEnv(16, seed=99)
    obs = other.load_state_dict(saved)
    assert torch.equal(obs, SnakeEnv(16, seed=3).load_state_dict(saved))
    second = [other.step(a)[0] for a in actions]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))  # food draws included


def test_nccl_preset_never_overrides_the_user():
    environ = {"NCCL_IB_DISABLE": "0", "PATH": "/bin"}
    chosen = apply_nccl_preset("nvlink", environ)
    assert environ["NCCL_IB_DISABLE"] == "0" and "NCCL_IB_DISABLE" not in chosen
    assert environ["NCCL_P2P_LEVEL"] == "NVL" and chosen["NCCL_P2P_LEVEL"] == "NVL"
    assert apply_nccl_preset("none", environ) == {}
    assert set(NCCL_PRESETS) == {"none", "nvlink", "ib"}


@pytest.mark.slow
def test_autoscale_keeps_user_values(tmp_path):
    cfg = load_config(["task=snake", "world_size=2"])
    cpu = autoscale_ppo(cfg, (7, 10, 10), world_size=2, local_world_size=2, device="cpu")
    assert cpu == {"num_envs": 256, "n_steps": 128, "batch_size": 4096}
    kept = autoscale_ppo(cfg, (7, 10, 10), world_size=2, local_world_size=2, fixed={"n_steps": 8}, device="cpu")
    assert kept["n_steps"] == 8 and kept["batch_size"] <= 128 * 8 // 4  # sized around the user's n_steps
    res = run_cli(
        [
            "train",
            "task=snake",
            "autoscale=true",
            "num_envs=32",
            "n_steps=8",
            "steps=256",
            "epochs=1",
            "eval_episodes=0",
            "progress=false",
            f"run_dir={tmp_path / 'a'}",
            "policy_width=8",
            "hidden_sizes=[16]",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (
        "autoscale set batch_size=" in res.stderr
        and "num_envs=" not in res.stderr.split("autoscale set")[1].splitlines()[0]
    )
    import yaml

    saved = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert (saved["num_envs"], saved["n_steps"]) == (32, 8)  # what the user set won


def test_autoscale_leaves_batch_size_to_minibatches_when_given():
    from ddprl.algos.ppo.autoscale import prepare
    from ddprl.runtime import resolved_config

    overrides = ["task=snake", "world_size=2", "device=cpu", "autoscale=true", "minibatches=4"]
    cfg = prepare(resolved_config(load_config(overrides)), overrides, None, resuming=False)
    assert cfg.minibatches == 4 and cfg.sources["batch_size"] == "from minibatches"
    assert cfg.batch_size == cfg.local_num_envs(2) * cfg.n_steps // 4  # from the sizes autoscale chose
