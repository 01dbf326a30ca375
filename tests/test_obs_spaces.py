"""Observation spaces PPO takes besides Box: encoded flat (one-hots, values) by the Gymnasium
vector env, normalised on their Box columns only, refused in one line when not encodable."""

from __future__ import annotations

import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import cli_env, run_cli
from gymnasium.vector.utils import batch_space

from ddprl.envs.flatten import FlatEncoder, unencodable
from ddprl.envs.gym_vec import GymVecEnv
from ddprl.metrics import read_metrics
from ddprl.normalize import RunningMeanStd

S = gym.spaces

# 8 envs x 64 steps per iteration, two iterations: a few seconds on one rank.
FAST = ["world_size=1", "steps=1024", "n_steps=64", "batch_size=128", "epochs=2", "progress=false", "eval_episodes=4"]


def test_discrete_is_one_hot_from_its_start():
    enc = FlatEncoder(S.Discrete(4, start=-1))
    out = enc(np.array([-1, 2, 0]), n=3)
    assert out.dtype == np.float32 and out.shape == (3, 4)
    np.testing.assert_array_equal(out, [[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]])
    assert enc.observation_space == S.Box(0.0, 1.0, (4,), np.float32)
    assert not enc.normalized.any()


def test_multidiscrete_is_its_one_hots_concatenated():
    enc = FlatEncoder(S.MultiDiscrete([3, 2], start=[1, 0]))
    out = enc(np.array([[1, 1], [3, 0]]), n=2)
    np.testing.assert_array_equal(out, [[1, 0, 0, 0, 1], [0, 0, 1, 1, 0]])
    grid = FlatEncoder(S.MultiDiscrete([[2, 3], [2, 2]]))  # variables in C order
    np.testing.assert_array_equal(grid(np.array([[[1, 2], [0, 1]]]), n=1), [[0, 1, 0, 0, 1, 1, 0, 0, 1]])


def test_multibinary_is_its_bits_as_floats():
    enc = FlatEncoder(S.MultiBinary((2, 2)))
    out = enc(np.array([[[1, 0], [0, 1]], [[0, 0], [1, 1]]], dtype=np.int8), n=2)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1, 0, 0, 1], [0, 0, 1, 1]])
    assert not enc.normalized.any()


def test_tuple_and_dict_concatenate_their_parts_dict_in_sorted_key_order():
    space = S.Tuple(
        (
            S.Discrete(2),
            S.Dict({"z": S.Box(-2, 2, (2,), np.float64), "a": S.MultiBinary(1), "m": S.Box(0, 9, (), np.int64)}),
        )
    )
    enc = FlatEncoder(space)
    batch = (np.array([1]), {"a": np.array([[1]], np.int8), "m": np.array([7]), "z": np.array([[-0.5, 1.5]])})
    np.testing.assert_array_equal(enc(batch, n=1), [[0, 1, 1, 7, -0.5, 1.5]])
    np.testing.assert_array_equal(enc.normalized, [False, False, False, True, True, True])
    np.testing.assert_array_equal(enc.observation_space.low, [0, 0, 0, 0, -2, -2])
    np.testing.assert_array_equal(enc.observation_space.high, [1, 1, 1, 9, 2, 2])


def test_the_encoding_is_gymnasium_flatten_for_every_sample_and_batch_size():
    space = S.Dict(
        {
            "pos": S.Box(-1, 1, (2, 3), np.float32),
            "cell": S.Discrete(5, start=2),
            "keys": S.MultiDiscrete([2, 4, 3]),
            "seen": S.MultiBinary(3),
            "inner": S.Tuple((S.Discrete(3), S.Box(0, 255, (2,), np.uint8))),
        },
        seed=0,
    )
    enc = FlatEncoder(space)
    for n in (1, 5):
        samples = [space.sample() for _ in range(n)]
        expected = np.stack([gym.spaces.flatten(space, s).astype(np.float32) for s in samples])
        batch = gym.vector.utils.concatenate(space, samples, gym.vector.utils.create_empty_array(space, n))
        np.testing.assert_array_equal(enc(batch, n), expected)
        np.testing.assert_array_equal(enc.each(samples), expected)
        assert enc(batch, n).shape == (n, enc.size) == (n, gym.spaces.flatdim(space))
    assert enc.observation_space.contains(enc.each([space.sample()])[0])


def test_a_batch_from_gymnasium_batch_space_encodes_row_by_row():
    space = S.Tuple((S.Discrete(32), S.Discrete(11), S.Discrete(2)))  # Blackjack's
    batched = batch_space(space, 6)
    batched.seed(1)
    batch = batched.sample()
    rows = FlatEncoder(space)(batch, 6)
    for i in range(6):
        hot = [batch[0][i], 32 + batch[1][i], 43 + batch[2][i]]
        assert rows[i].sum() == 3 and (rows[i, hot] == 1).all()


@pytest.mark.parametrize(
    "space,part",
    [
        (S.Text(4), "Text"),
        (S.Graph(S.Box(0, 1, (2,)), S.Discrete(3)), "Graph"),
        (S.Sequence(S.Discrete(2)), "Sequence"),
        (S.Dict({"a": S.Discrete(2), "b": S.Tuple((S.Box(0, 1), S.Sequence(S.Discrete(2))))}), "Sequence"),
        (S.Tuple(()), "Tuple"),
    ],
)
def test_spaces_without_an_encoding_are_named(space, part):
    bad = unencodable(space)
    assert type(bad).__name__ == part
    with pytest.raises(ValueError, match="cannot encode"):
        FlatEncoder(space)


def test_encodable_spaces():
    for space in (S.Box(0, 1, (3, 8, 8)), S.Discrete(2), S.Tuple((S.MultiBinary(2), S.Dict({"x": S.Discrete(3)})))):
        assert unencodable(space) is None


def test_gym_vec_env_gives_one_hots_and_encoded_final_observations():
    env = GymVecEnv("FrozenLake-v1", num_envs=3, seed=0, is_slippery=False)
    assert env.single_observation_space == S.Box(0.0, 1.0, (16,), np.float32)
    assert env.task_observation_space == S.Discrete(16)
    obs = env.reset()
    assert obs.dtype == torch.float32 and obs.shape == (3, 16)
    assert torch.equal(obs, torch.eye(16)[[0, 0, 0]])  # every episode starts in the top-left cell
    obs, *_ = env.step(torch.tensor([1, 1, 2]))  # down, down, right
    assert torch.equal(obs, torch.eye(16)[[4, 4, 1]])
    obs, _, terminated, _, info = env.step(torch.tensor([2, 1, 2]))  # env 0 walks into the hole at cell 5
    assert terminated.tolist() == [True, False, False]
    assert torch.equal(info["final_obs"][0], torch.eye(16)[5])
    assert torch.equal(obs, torch.eye(16)[[0, 8, 2]])  # env 0 starts its next episode
    env.close()


def test_gym_vec_env_leaves_a_box_as_it_is():
    env = GymVecEnv("CartPole-v1", num_envs=2, seed=0)
    assert env.single_observation_space is env.task_observation_space and env.norm_obs_mask is None
    env.close()


def test_norm_obs_rescales_box_columns_only_and_saves_what_it_always_saved():
    rms = RunningMeanStd((3,), mask=torch.tensor([True, False, False]))
    x = torch.tensor([[5.0, 1.0, 0.0], [7.0, 0.0, 1.0]])
    rms.update(x)
    torch.testing.assert_close(rms.normalize(x)[:, 0], torch.tensor([-1.0, 1.0]))
    assert torch.equal(rms.normalize(x)[:, 1:], x[:, 1:])  # exactly: one-hots stay 0 and 1
    assert list(rms.state_dict()) == ["mean", "var", "count"]
    plain = RunningMeanStd((3,))
    plain.load_state_dict(rms.state_dict())
    assert torch.equal(plain.normalize(x), rms.normalize(x))  # eval and play need no mask


@pytest.mark.slow
def test_frozenlake_trains_evaluates_and_plays(tmp_path):
    run_dir = tmp_path / "fl"
    res = run_cli(["train", "task=FrozenLake-v1", f"run_dir={run_dir}", *FAST], cwd=tmp_path, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    final = read_metrics(run_dir)[-1]
    assert final["step"] == 1024 and final["eval/episodes"] == 4 and 0 <= final["eval/return_mean"] <= 1
    ev = run_cli(["eval", f"checkpoint={run_dir}", "episodes=2", "device=cpu"], cwd=tmp_path, timeout=240)
    assert ev.returncode == 0 and ev.stdout.strip().splitlines()[-1].endswith("episodes=2"), ev.stderr[-3000:]
    play = run_cli(["play", f"checkpoint={run_dir}", "fps=1000"], cwd=tmp_path, timeout=240)  # FrozenLake draws text
    assert play.returncode == 0 and "return=" in play.stdout, play.stderr[-3000:]


def test_blackjack_trains_with_norm_obs_leaving_its_one_hots_alone(tmp_path):
    run_dir = tmp_path / "bj"
    res = run_cli(
        ["train", "task=Blackjack-v1", "norm_obs=true", f"run_dir={run_dir}", *FAST], cwd=tmp_path, timeout=240
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert read_metrics(run_dir)[-1]["eval/episodes"] == 4
    rms = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["state"]["obs_rms"]
    assert rms["count"].item() == 1024
    assert torch.equal(rms["mean"], torch.zeros(45, dtype=torch.float64))
    assert torch.equal(rms["var"], torch.ones(45, dtype=torch.float64))


# The real CLI, in a process that first registers a task observing a space PPO cannot take.
REGISTER_AND_RUN = """
import sys
import gymnasium as gym
from ddprl.cli import entry

class Obs(gym.Env):
    observation_space = {space}
    action_space = gym.spaces.Discrete(2)

gym.register("ddprl-test/Obs-v0", entry_point=Obs)
sys.argv[0] = "ddprl"
entry()
"""


@pytest.mark.parametrize(
    "space,message",
    [
        ("gym.spaces.Text(8)", r"; ddprl-test/Obs-v0 observes Text\(1, 8, charset=\w+\)$"),
        (
            "gym.spaces.Dict({'a': gym.spaces.Discrete(3), 'b': gym.spaces.Sequence(gym.spaces.Discrete(2))})",
            r"observes Dict\('a': Discrete\(3\), 'b': Sequence\(Discrete\(2\), stack=False\)\), with a Sequence part$",
        ),
    ],
)
def test_an_unencodable_space_is_refused_in_one_line_before_anything_starts(tmp_path, space, message):
    script = REGISTER_AND_RUN.format(space=space)
    res = subprocess.run(
        [sys.executable, "-c", script, "train", "task=ddprl-test/Obs-v0", "world_size=2"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(
        "ddprl: error: ppo observes Box, Discrete, MultiDiscrete or MultiBinary spaces, or a Tuple or Dict of these;"
    ), lines[0]
    assert re.search(message, lines[0]), lines[0]
    assert list(tmp_path.iterdir()) == []  # no run directory, nothing else
