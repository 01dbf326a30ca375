"""MuJoCo on EnvPool (``env_backend=envpool``): Gymnasium's spaces and, from one state, Gymnasium's
episodes step for step (observations, rewards, ends, the final observation of an ended episode and
the next one's first); a seed replays its episodes; the time limit; episode bookkeeping; the
one-line refusals; a short ``ddprl train`` end to end."""

from __future__ import annotations

import importlib.util
import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import run_cli

from ddprl.cli import main
from ddprl.envs import check_task, make_env, rendering
from ddprl.envs.envpool_mujoco import EnvPoolMujocoVecEnv, mujoco_task
from ddprl.envs.gym_vec import GymVecEnv
from ddprl.errors import UsageError

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="envpool is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs mujoco (gymnasium[mujoco])"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # Gymnasium's v4 MuJoCo envs say v5 is out
]


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def both(task: str, num_envs: int, **kwargs) -> tuple[EnvPoolMujocoVecEnv, GymVecEnv]:
    pool = make_env(task, num_envs, seed=0, backend="envpool", **kwargs)
    gym_env = make_env(task, num_envs, seed=0, backend="gymnasium", **kwargs)
    assert isinstance(pool, EnvPoolMujocoVecEnv) and isinstance(gym_env, GymVecEnv)
    return pool, gym_env


def actions(env, steps: int, seed: int = 0) -> torch.Tensor:
    """Uniform actions over 1.2 times the box (some clipped, as a Gaussian policy's)."""
    space = env.single_action_space
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(steps, env.num_envs, *space.shape, generator=g) * 2.4 - 1.2
    return u * torch.as_tensor(space.high)


@pytest.mark.parametrize(
    "task", ["HalfCheetah-v4", "HalfCheetah-v5", "Hopper-v4", "Humanoid-v5", "Reacher-v4", "InvertedPendulum-v5"]
)
def test_spaces_are_gymnasiums_for_the_same_version(task):
    env = make_env(task, 1, seed=0, backend="envpool")
    reference = gym.make(task)
    assert env.single_observation_space == reference.observation_space
    assert env.single_action_space == reference.action_space  # float32 actions, as Gymnasium's
    env.close()
    reference.close()


# Without reset noise every episode starts in the model's initial state: both back-ends then run the
# same episodes, and Hopper, Walker2d, Ant, Humanoid fall (terminate) within the 40 steps.
@pytest.mark.parametrize(
    "task", ["HalfCheetah-v5", "Hopper-v4", "Hopper-v5", "Walker2d-v5", "Ant-v4", "Humanoid-v4", "Humanoid-v5"]
)
def test_from_one_state_the_same_actions_make_gymnasiums_episodes(task):
    pool, ref = both(task, 2, reset_noise_scale=0.0)
    obs, ref_obs = pool.reset(), ref.reset()
    torch.testing.assert_close(obs, ref_obs)
    ended = 0
    for a in actions(pool, 40):
        obs, reward, terminated, truncated, info = pool.step(a)
        ref_obs, ref_reward, ref_terminated, ref_truncated, ref_info = ref.step(a)
        # Humanoid-v4's contact forces (cfrc_ext) too: EnvPool computes them as Gymnasium 1.x does
        torch.testing.assert_close(obs, ref_obs, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(reward, ref_reward, rtol=1e-4, atol=1e-4)
        assert torch.equal(terminated, ref_terminated) and torch.equal(truncated, ref_truncated)
        done = terminated | truncated
        torch.testing.assert_close(info["final_obs"][done], ref_info["final_obs"][done], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(info["episode_return"][done], ref_info["episode_return"][done])
        assert torch.equal(info["episode_length"][done], ref_info["episode_length"][done])
        ended += int(done.sum())
    assert ended > 0 or task.startswith("HalfCheetah")
    pool.close()
    ref.close()


def test_a_seed_replays_its_episodes_env_i_takes_seed_plus_i():
    env = make_env("Hopper-v4", 3, seed=7, backend="envpool")
    moves = actions(env, 60)

    def episodes(first: torch.Tensor) -> list[torch.Tensor]:
        out = [first]
        for a in moves:
            obs, reward, terminated, truncated, info = env.step(a)
            out += [obs, reward, terminated, info["final_obs"]]
        return out

    first = episodes(env.reset())
    assert all(torch.equal(x, y) for x, y in zip(first, episodes(env.reset(seed=7)), strict=True))
    assert all(torch.equal(x, y) for x, y in zip(first, episodes(env.reset()), strict=True))  # its own seed
    assert not torch.equal(first[0], env.reset(seed=8))
    env.close()
    # env 1 of seed 7 is env 0 of seed 8: the seeds of a rank's envs (seed + r * 10000 + i) as on Gymnasium
    one = make_env("Hopper-v4", 1, seed=8, backend="envpool")
    torch.testing.assert_close(one.reset()[0], first[0][1], rtol=0, atol=0)
    one.close()


def test_the_time_limit_truncates_with_the_last_observation_and_starts_anew():
    pool, ref = both("HalfCheetah-v4", 2, reset_noise_scale=0.0, max_episode_steps=5)
    start = pool.reset()
    torch.testing.assert_close(start, ref.reset())
    rewards = []
    for t, a in enumerate(actions(pool, 12)):
        obs, reward, terminated, truncated, info = pool.step(a)
        ref_obs, _, _, ref_truncated, ref_info = ref.step(a)
        rewards.append(reward)
        assert not terminated.any() and torch.equal(truncated, ref_truncated)
        assert bool(truncated.all()) == ((t + 1) % 5 == 0) and bool(truncated.all()) == bool(truncated.any())
        if truncated.all():
            # the ended episode's own last observation, to bootstrap from; the next episode's first in obs
            torch.testing.assert_close(info["final_obs"], ref_info["final_obs"], rtol=1e-5, atol=1e-5)
            assert not torch.allclose(info["final_obs"], obs)
            torch.testing.assert_close(obs, start)
            assert info["episode_length"].tolist() == [5, 5]
            torch.testing.assert_close(info["episode_return"], torch.stack(rewards).sum(0), rtol=1e-5, atol=1e-5)
            rewards = []
        else:
            assert torch.equal(info["final_obs"], obs)
            assert info["episode_length"].tolist() == [len(rewards)] * 2
    pool.close()
    ref.close()


def test_episode_returns_and_lengths_are_sums_and_counts_of_the_steps():
    env = make_env("Hopper-v4", 4, seed=3, backend="envpool")
    env.reset()
    total, count, ends = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int64), 0
    for a in actions(env, 150, seed=1):
        _, reward, terminated, truncated, info = env.step(a)
        assert reward.dtype == torch.float32 and info["final_obs"].dtype == torch.float32
        total += reward.double()
        count += 1
        done = terminated | truncated
        torch.testing.assert_close(info["episode_return"][done].double(), total[done], rtol=1e-5, atol=1e-5)
        assert torch.equal(info["episode_length"][done], count[done])
        total[done], count[done] = 0, 0
        ends += int(done.sum())
    assert ends >= 4  # a random Hopper falls within tens of steps
    env.close()


def test_versions_envpool_lacks_and_wrong_keywords_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    assert mujoco_task("Walker2d-v5") == ("Walker2d", "v5") and mujoco_task("Pong-v5") is None
    with pytest.raises(UsageError) as e:
        check_task("HalfCheetah-v3", "envpool")
    assert str(e.value) == (
        "task=HalfCheetah-v3 env_backend=envpool: ddprl runs HalfCheetah on EnvPool as HalfCheetah-v4 or "
        "HalfCheetah-v5 (Gymnasium's versions); use task=HalfCheetah-v5 or env_backend=gymnasium"
    )
    check_task("HalfCheetah-v3", "gymnasium")  # Gymnasium knows the name (and says what it needs when made)
    with pytest.raises(UsageError, match=r"takes no 'reset_noise' \(did you mean reset_noise_scale\?\); it takes"):
        make_env("Hopper-v5", 1, seed=0, backend="envpool", reset_noise=0.0)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "task=Hopper-v2", "env_backend=envpool", "world_size=1", "device=cpu"]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        "ddprl: error: task=Hopper-v2 env_backend=envpool: ddprl runs Hopper on EnvPool as Hopper-v4 or "
        "Hopper-v5 (Gymnasium's versions); use task=Hopper-v5 or env_backend=gymnasium"
    ]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else find_spec(name, *a)
    )
    with pytest.raises(UsageError, match=r"^task=Hopper-v5 env_backend=envpool needs EnvPool .*pip install envpool"):
        check_task("Hopper-v5", "envpool")


def test_auto_keeps_gymnasium_and_frames_come_from_gymnasium():
    env = make_env("HalfCheetah-v5", 1, seed=0)
    assert isinstance(env, GymVecEnv)
    env.close()
    with rendering("rgb_array"):  # play and videos: Gymnasium's renderer on the same task
        env = make_env("HalfCheetah-v5", 1, seed=0, backend="envpool", max_episode_steps=10)
    assert isinstance(env, GymVecEnv) and env.render_mode == "rgb_array"
    env.close()


@pytest.mark.slow
def test_train_on_envpool_writes_metrics(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(
        [
            "train",
            "task=HalfCheetah-v4",
            "env_backend=envpool",
            "steps=2048",
            "world_size=1",
            "device=cpu",
            "num_envs=2",
            "n_steps=512",
            "env_kwargs.max_episode_steps=200",
            "eval_episodes=2",
            "progress=false",
            f"run_dir={run_dir}",
        ],
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    returns = [r["train/episode_return"] for r in rows if "train/episode_return" in r]
    assert returns and all(np.isfinite(returns)) and any("time/global_fps" in r for r in rows)
    assert any("eval/return_mean" in r for r in rows)
