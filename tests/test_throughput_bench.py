"""benchmarks/throughput.py without its peers: the ddprl keys of each pair resolve to the peer's hyperparameters,
and the rates come out of SB3's, CleanRL's and ddprl's records as meant."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import harness as h  # noqa: E402 (the path above first)
import throughput as T  # noqa: E402

from ddprl.config import load_config  # noqa: E402


def resolved(name: str, steps: int = 40_960):
    return load_config(T.ddprl_keys(T.PAIRS[name], steps)).resolved(1)


# what each peer runs with its defaults: SB3's PPO (vf_coef 0.5 of F.mse_loss: 1.0 of ddprl's 0.5 x mean square),
# CleanRL's ppo.py and ppo_continuous_action.py
SB3 = dict(num_envs=1, n_steps=2048, batch_size=64, epochs=10, lr=3e-4, anneal_lr=False, clip_vloss=False)
SB3 |= dict(vf_coef=1.0, ent_coef=0.0, norm_obs=False, norm_reward=False)
CLEANRL = dict(num_envs=4, n_steps=128, batch_size=128, epochs=4, lr=2.5e-4, anneal_lr=True, clip_vloss=True)
CLEANRL |= dict(vf_coef=0.5, ent_coef=0.01, norm_obs=False, norm_reward=False)
CONTINUOUS = dict(num_envs=1, n_steps=2048, batch_size=64, epochs=10, lr=3e-4, anneal_lr=True, clip_vloss=True)
CONTINUOUS |= dict(vf_coef=0.5, ent_coef=0.0, norm_obs=True, norm_reward=True)
COMMON = dict(
    world_size=1,
    device="cpu",
    gamma=0.99,
    gae_lambda=0.95,
    clip_coef=0.2,
    max_grad_norm=0.5,
    target_kl=None,
    norm_adv="minibatch",
    hidden_sizes=[64, 64],
    activation="tanh",
    ortho_init=True,
    log_std_init=0.0,
    eval_freq=0,
    eval_episodes=0,
    checkpoint_freq=0,
    steps=40_960,
)


@pytest.mark.parametrize(
    "name, task, expected",
    [
        ("cartpole-sb3", "CartPole-v1", SB3),
        ("halfcheetah-sb3", "HalfCheetah-v5", SB3),  # the keys win over the task's preset (CleanRL's values)
        ("cartpole-cleanrl", "CartPole-v1", CLEANRL),
        ("halfcheetah-cleanrl", "HalfCheetah-v4", CONTINUOUS),
        ("cartpole-pufferlib", "CartPole-v1", CLEANRL),  # PUFFER_DRIVER runs CleanRL ppo.py's settings
    ],
)
def test_the_keys_of_a_pair_resolve_to_the_peers_hyperparameters(name, task, expected):
    cfg = resolved(name)
    got = {key: getattr(cfg, key) for key in {**COMMON, **expected}}
    assert got == {**COMMON, **expected} and cfg.task == task
    pair = T.PAIRS[name]
    assert cfg.num_envs * cfg.n_steps == pair.iteration  # the warm-up left out is one iteration of both programs


def test_the_targets_and_extra_keys():
    assert {name: pair.target for name, pair in T.PAIRS.items()} == {
        "cartpole-sb3": 3.0,
        "cartpole-cleanrl": 2.0,
        "halfcheetah-sb3": 2.0,
        "halfcheetah-cleanrl": 0.0,
        "cartpole-pufferlib": 0.0,
    }
    assert load_config(T.ddprl_keys(T.PAIRS["cartpole-sb3"], 4096, ["compile=true"])).compile is True
    assert load_config(T.ddprl_keys(T.PAIRS["cartpole-sb3"], 10**8)).compile is False  # eager, however long


CLEANRL_OUT = [
    (10.0, "global_step=120, episodic_return=[12.]"),
    (10.5, "SPS: 1500"),
    (11.0, "global_step=700, episodic_return=[30.]"),
    (12.5, "SPS: 1320"),
    (14.5, "SPS: 1250"),
]


def test_cleanrl_sps_lines():
    points = h.sps_points(CLEANRL_OUT, 512)
    assert points == [(512, 10.5), (1024, 12.5), (1536, 14.5)]
    assert h.rate(points) == pytest.approx(1024 / 4.0)  # the first iteration left out
    assert h.last_sps(CLEANRL_OUT) == 1250.0


def test_a_drivers_line_and_rate():
    line = json.dumps({"points": [[2048, 5.0], [4096, 6.0], [6144, 8.0]], "own": 900.0, "n_steps": 2048})
    out = T.driver_result([(0.0, "Using cpu device"), (1.0, line), (1.1, "Exception ignored in atexit")])
    assert out["own"] == 900.0 and h.rate(out["points"]) == pytest.approx(4096 / 3.0)
    with pytest.raises(RuntimeError, match="too few"):
        h.rate([(2048, 5.0)])
    for name in {pair.script for pair in T.PAIRS.values() if pair.peer != "cleanrl"}:
        compile(getattr(T, name), name, "exec")  # each driver a pair names is Python


def test_cleanrl_flags_name_the_task_and_budget():
    flags = T.cleanrl_flags(T.PAIRS["halfcheetah-cleanrl"], 40_960)
    assert flags[:4] == ["--env-id", "HalfCheetah-v4", "--total-timesteps", "40960"]
