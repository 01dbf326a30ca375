"""Atari for PPO: task names and preset, both back-ends' observations and seeding, episodic life
for the learner against whole games for the score, the Nature CNN, 2 ranks == one process on
Atari frames, train / eval / video end to end, and the one-line refusal without the packages."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import math
import re
import subprocess
import sys

import atari_fns
import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import cli_env, run_cli

from ddprl.algos.ppo import loop as ppo_loop
from ddprl.algos.ppo.networks import ActorCritic, NatureCNN
from ddprl.algos.ppo.rollout import RolloutBuffer, RolloutStep
from ddprl.cli import main
from ddprl.config import CONFIG_DIR, load_config, to_dict
from ddprl.envs import check_task, make_env
from ddprl.envs.atari import (
    AtariVecEnv,
    EnvPoolAtari,
    GymnasiumAtari,
    Settings,
    atari_rom,
    install_message,
    missing_packages,
)
from ddprl.errors import UsageError
from ddprl.metrics import read_metrics
from ddprl.prepare import prepare_train
from ddprl.runtime import launch, resolved_config
from ddprl.runtime.placement import Placement

# find_spec, not an import: importing ale-py registers its own ids (BreakoutNoFrameskip-v4) with Gymnasium
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("ale_py", "cv2")), reason='needs pip install -e ".[atari]"'
)
HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
BACKENDS = [
    pytest.param("envpool", marks=pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool is not installed")),
    "gymnasium",
]
GAMES = {"envpool": EnvPoolAtari, "gymnasium": GymnasiumAtari}


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as each ddprl rank runs: a CNN on 2 frames took 80 ms with 2 threads
    on a busy 2-core machine, 3.5 ms with 1."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- names, preset ---------------------------------------------------------------------------------------


def test_both_spellings_name_one_game_and_others_are_refused_with_a_near_match():
    assert atari_rom("Breakout-v5") == atari_rom("ALE/Breakout-v5") == "breakout"
    assert atari_rom("TicTacToe3D-v5") == atari_rom("TicTacToe3d-v5") == "tic_tac_toe_3d"  # ALE's and EnvPool's
    assert atari_rom("Breakout-v4") is None and atari_rom("CartPole-v1") is None
    with pytest.raises(UsageError, match=r"unknown task 'Breakot-v5' \(did you mean Breakout-v5"):
        check_task("Breakot-v5")
    with pytest.raises(UsageError, match="env_backend=envpool chooses how Atari games run; CartPole-v1"):
        make_env("CartPole-v1", 1, seed=0, backend="envpool")


def test_the_atari_preset_applies_to_every_game_and_spelling_with_a_source_per_value():
    breakout, ale = load_config(["task=Breakout-v5"]), load_config(["task=ALE/Breakout-v5"])
    assert to_dict(ale) | {"task": "Breakout-v5"} == to_dict(breakout)
    assert to_dict(load_config(["task=Pong-v5"])) | {"task": "Breakout-v5"} == to_dict(breakout)
    preset = {k for k, source in breakout.sources.items() if source == "task preset"}
    assert {"policy", "num_envs", "n_steps", "minibatches", "epochs", "lr", "clip_coef", "ent_coef"} <= preset
    assert (breakout.policy, breakout.num_envs, breakout.n_steps, breakout.clip_coef) == ("nature_cnn", 8, 128, 0.1)
    lines = [line for line in (CONFIG_DIR / "task" / "_atari.yaml").read_text().splitlines() if line.startswith("  ")]
    assert [line for line in lines if "#" not in line and not line.strip().startswith(("eval_", "checkpoint_"))] == []
    # num_envs is global: 1 or 2 ranks cut the 8 x 128 rollout into 4 minibatches of 256
    for world_size in (1, 2):
        cfg = resolved_config(load_config(["task=Breakout-v5", f"world_size={world_size}"]))
        assert cfg.effective_batch_size(world_size) == 256
        assert cfg.local_num_envs(world_size) * cfg.n_steps // cfg.batch_size == 4


def test_keys_show_the_atari_preset(capsys):
    assert main(["keys", "task=Breakout-v5"]) == 0
    out = capsys.readouterr().out
    assert "_atari.yaml" in out
    assert re.search(r"^policy\s+str\s+nature_cnn\s+preset\s", out, re.M)
    assert re.search(r"^env_backend\s+str\s+auto\s+default\s", out, re.M)


# -- back-ends ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_observations_are_stacked_grey_frames_and_a_seed_replays_its_games(backend):
    def frames(seed: int) -> np.ndarray:
        games = GAMES[backend]("pong", 2, seed, Settings(), episodic_life=True)
        out = [games.reset(seed)]
        rng = np.random.default_rng(0)
        out += [games.step(rng.integers(0, 6, 2)).obs for _ in range(30)]
        assert games.action_space == gym.spaces.Discrete(6)
        games.close()
        return np.stack(out)

    a, b, c = frames(5), frames(5), frames(6)
    assert a.shape == (31, 2, 4, 84, 84) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    env = AtariVecEnv("ALE/Pong-v5", 2, seed=5, backend=backend)
    obs = env.reset()
    assert env.backend == backend and obs.shape == (2, 4, 84, 84) and obs.dtype == torch.float32
    assert torch.equal(obs, torch.from_numpy(a[0]).float())
    assert env.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert env.render_rgb(1).shape == (210, 160, 3)
    env.close()


def play(env: AtariVecEnv, steps: int) -> dict[str, np.ndarray]:
    """``steps`` random steps; each step's tensors and the back-end's raw rewards, (steps, N) each."""
    (games,) = env.games
    raw, games_recv = [], games.recv

    def recording():
        step = games_recv()
        raw.append(step.reward.copy())
        return step

    games.recv = recording
    g = torch.Generator().manual_seed(0)
    env.reset()
    rows = []
    for _ in range(steps):
        actions = torch.randint(0, env.single_action_space.n, (2,), generator=g)
        _, reward, terminated, truncated, info = env.step(actions)
        scores = [info[k] for k in ("episode_end", "episode_return", "episode_length")]
        rows.append([reward, terminated, truncated, *scores])
    env.close()
    names = ("reward", "terminated", "truncated", "end", "return", "length")
    out = {name: torch.stack([row[i] for row in rows]).numpy() for i, name in enumerate(names)}
    return out | {"raw": np.stack(raw)}


def assert_whole_game_scores(run: dict[str, np.ndarray]) -> None:
    """At each game's end: the raw score and the agent steps since the previous end."""
    for i in range(run["raw"].shape[1]):
        start = 0
        for t in np.flatnonzero(run["end"][:, i]):
            assert run["return"][t, i] == run["raw"][start : t + 1, i].sum()
            assert run["length"][t, i] == t + 1 - start
            start = t + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_ends_an_episode_per_life_and_clips_rewards_the_score_is_whole_raw_games(backend):
    # Breakout: 5 lives; the learner's episodes end at each, the score at the game's end.
    run = play(AtariVecEnv("Breakout-v5", 2, seed=1, training=True, backend=backend), 500)
    done = run["terminated"] | run["truncated"]
    assert run["end"].sum() >= 2 and done.sum() >= 3 * run["end"].sum()  # several lives per game
    assert not (run["end"] & ~done).any()
    assert_whole_game_scores(run)
    # Space Invaders scores 5 to 30 a hit: the learner sees 1, the score keeps the points.
    run = play(AtariVecEnv("SpaceInvaders-v5", 2, seed=1, training=True, backend=backend, max_episode_steps=120), 250)
    assert run["raw"].max() >= 5 and np.array_equal(run["reward"], np.sign(run["raw"]))
    assert run["end"].sum() >= 2 and run["truncated"][run["end"]].all()  # whole games, cut at 120 steps
    assert_whole_game_scores(run)
    assert run["return"][run["end"]].max() >= 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_evaluation_plays_whole_games_with_raw_rewards(backend):
    run = play(AtariVecEnv("Breakout-v5", 2, seed=1, training=False, backend=backend), 400)
    assert np.array_equal(run["terminated"] | run["truncated"], run["end"]) and run["end"].sum() >= 2
    assert np.array_equal(run["reward"], run["raw"])
    assert_whole_game_scores(run)


def test_the_rollout_counts_whole_games_not_lives():
    """PPO's rollout sums the episodes ``episode_end`` marks (games), not each lost life."""
    env = AtariVecEnv("Breakout-v5", 2, seed=1, training=True, backend="gymnasium", max_episode_steps=60)
    ends, step = [], env.step

    def recording(actions):
        out = step(actions)
        ends.append((out[2] | out[3], out[4]["episode_end"], out[4]["episode_return"]))
        return out

    env.step = recording
    buffer = RolloutBuffer(150, 2, (4, 84, 84), (), torch.long, torch.device("cpu"))
    rollout = RolloutStep(
        env, atari_fns.nature_cnn_agent(4), buffer, lambda x: x, contextlib.nullcontext(), obs=env.reset()
    )
    ep_return_sum, ep_count = rollout.collect()
    env.close()
    done, end, score = (torch.stack(column) for column in zip(*ends, strict=True))
    assert done.sum() > end.sum() >= 4 and ep_count == end.sum()
    assert ep_return_sum == (score * end).sum()


def joined(first: tuple, second: tuple) -> tuple:
    """Two parts' steps as one: tensors and info entries concatenated."""
    tensors = [torch.cat([x, y]) for x, y in zip(first[:4], second[:4], strict=True)]
    return (*tensors, {k: torch.cat([first[4][k], second[4][k]]) for k in first[4]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_games_in_two_parts_step_as_one_env(backend):
    """``parts=2``: two back-ends of half the games each (env ``i`` still seeded ``seed + i``),
    each part sent and received alone, give what one part gives, step by step (life losses,
    game overs and the time limit included)."""
    g = torch.Generator().manual_seed(3)
    actions = torch.randint(0, 4, (300, 4), generator=g)
    runs = []
    for parts in (1, 2):
        env = AtariVecEnv("Breakout-v5", 4, seed=2, training=True, backend=backend, max_episode_steps=90, parts=parts)
        rows = [env.reset()]
        for a in actions:
            if parts == 1:
                out = env.step(a)
            else:
                env.send(a[:2], 0)
                env.send(a[2:], 1)  # both halves stepping at once
                second, first = env.recv(1), env.recv(0)  # received in either order
                out = joined(first, second)
            rows.append((*out[:4], *out[4].values()))
        assert env.render_rgb(3).shape == (210, 160, 3)
        env.close()
        runs.append(rows)
    one, two = runs
    assert torch.equal(one[0], two[0])
    for a, b in zip(one[1:], two[1:], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    ends = torch.stack([row[2] | row[3] for row in one[1:]])
    assert ends.sum() >= 8 and torch.stack([row[3] for row in one[1:]]).any()  # lives lost, time limits hit
    with pytest.raises(UsageError, match="cannot be split into 2 equal parts"):
        AtariVecEnv("Breakout-v5", 3, backend=backend, parts=2)
    with pytest.raises(UsageError, match="EnvPool's threads, pinned to contiguous cores"):
        AtariVecEnv("Breakout-v5", 4, backend=backend, parts=2, threads_on=[0, 2] if backend == "envpool" else [1])


def test_a_rollout_in_two_parts_stores_what_one_part_stores():
    """PPO's rollout acting on one half of the games while the other steps (``env.parts == 2``)
    stores the observations, actions, rewards, ends, episode sums, next observation and generator
    draws of the rollout over all games at once, bit for bit; log-probs and values to float
    rounding (the Nature CNN's sums over half batches). Truncations included."""
    backend = "envpool" if HAS_ENVPOOL else "gymnasium"
    runs = []
    for parts in (1, 2):
        env = AtariVecEnv("Breakout-v5", 4, seed=1, training=True, backend=backend, max_episode_steps=70, parts=parts)
        buffer = RolloutBuffer(96, 4, (4, 84, 84), (), torch.long, torch.device("cpu"), torch.uint8)
        torch.manual_seed(0)
        rollout = RolloutStep(
            env, atari_fns.nature_cnn_agent(4), buffer, lambda x: x, contextlib.nullcontext(), obs=env.reset()
        )
        torch.manual_seed(7)
        sums = [torch.stack(rollout.collect()) for _ in range(2)]
        runs.append((rollout, sums, torch.get_rng_state()))
        env.close()
    (one, one_sums, one_rng), (two, two_sums, two_rng) = runs
    truncated = one.buffer.data.truncated
    assert truncated.any() and torch.equal(truncated, two.buffer.data.truncated)
    for name, a, b in zip(one.buffer.data._fields, one.buffer.data, two.buffer.data, strict=True):
        if name == "final_values":  # read where truncated; one part scores every game's final frame there
            a, b = a[truncated], b[truncated]
        if name in ("log_probs", "values", "final_values"):  # half batches: other sums, float rounding
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # 1-4e-7 here
        else:
            assert a.dtype == b.dtype and torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(one_sums, two_sums, strict=True)) and one_sums[1][1] > 0
    assert torch.equal(one.obs, two.obs) and torch.equal(one_rng, two_rng) and int(two.cursor) == 96


@pytest.mark.parametrize("parts", [1, 2])
def test_a_bf16_rollout_acts_through_its_bf16_trunk_as_the_policy_acts(parts):
    """Under bf16 autocast a CPU rollout acts through a copy of the policy whose trunk is bf16
    already (autocast would cast the weights at every act): the rows it stores are those of the
    policy acting itself, bit for bit, also after the policy's weights change between rollouts
    (the copy is refreshed as each rollout starts), in one part and in two."""
    backend = "envpool" if HAS_ENVPOOL else "gymnasium"
    policy = atari_fns.nature_cnn_agent(4)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    runs = []
    for cast in (True, False):
        policy.load_state_dict(start)
        env = AtariVecEnv("Breakout-v5", 4, seed=1, training=True, backend=backend, max_episode_steps=70, parts=parts)
        buffer = RolloutBuffer(24, 4, (4, 84, 84), (), torch.long, torch.device("cpu"), torch.uint8)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
        rollout = RolloutStep(env, policy, buffer, lambda x: x, autocast, obs=env.reset())
        assert rollout.act.__self__ is rollout.cast.policy
        assert next(rollout.cast.policy.trunk.parameters()).dtype == torch.bfloat16
        if not cast:  # the policy acting itself
            rollout.cast, rollout.act = None, policy.act_with_noise
        torch.manual_seed(7)
        stored = []
        for i in range(2):
            with torch.no_grad():  # an update between the rollouts
                for p in policy.parameters():
                    p.mul_(1.0 + 0.05 * i)
            rollout.collect()
            stored.append([x.clone() for x in buffer.data])
        runs.append(stored)
        env.close()
    for one, two in zip(*runs, strict=True):
        for name, a, b in zip(buffer.data._fields, one, two, strict=True):
            assert torch.equal(a, b), name


def test_env_overlap_splits_the_games_where_a_core_or_gpu_can_step_them(monkeypatch, caplog):
    """``env_overlap``: false never; auto where the games are EnvPool's, two equal parts a rank,
    and the rank has a second core of its own or a GPU; EnvPool's threads pinned to the rank's
    cores but its first where they are contiguous; true refused in one line where it cannot."""
    caplog.set_level(logging.INFO, logger="ddprl")

    def split(*keys, device="cpu", local_num_envs=8, cores=(0, 1)):
        monkeypatch.setattr(ppo_loop, "rank_cores", lambda placement, cpu_bind: list(cores))
        placement = Placement("spawn", 0, 0, 1, 1, "127.0.0.1", 0, torch.device(device), "gloo")
        return ppo_loop.env_split(load_config(["task=Breakout-v5", *keys]), placement, local_num_envs)

    assert split("env_overlap=false") == {} and not caplog.messages
    assert split("task=CartPole-v1") == {} and not caplog.messages  # nothing to say: not a game
    if HAS_ENVPOOL:
        assert split() == {"parts": 2, "threads_on": [1]}
        assert caplog.messages[-1] == (
            "env_overlap: the policy acts on half of the 8 games while the other half steps "
            "(EnvPool's threads on core 1)"
        )
        assert split(cores=range(4, 8)) == {"parts": 2, "threads_on": [5, 6, 7]}
        assert split(cores=(0, 2, 5)) == {"parts": 2, "threads_on": None} and "on any core" in caplog.messages[-1]
        assert split(cores=(3,)) == {} and "this rank has one core of its own" in caplog.messages[-1]
        assert split(device="cuda", cores=()) == split("env_overlap=true", cores=()) == {"parts": 2, "threads_on": None}
    assert split(local_num_envs=3) == {} and caplog.messages[-1].startswith("env_overlap=auto: the games step together")
    assert split("env_backend=gymnasium") == {} and "on Gymnasium" in caplog.messages[-1]
    for keys, why in [
        (["num_envs=6", "world_size=2"], "a rank's 3 games do not split into two equal parts"),
        (["env_backend=gymnasium"], "the games run on Gymnasium"),
        (["task=CartPole-v1"], "CartPole-v1 is no Atari game"),
    ]:
        cfg = resolved_config(load_config(["task=Breakout-v5", "env_overlap=true", *keys]))
        with pytest.raises(UsageError, match=f"^env_overlap=true: {re.escape(why)}"):
            cfg.check()


@pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool is not installed")
def test_env_overlap_reaches_the_rollout(tmp_path, monkeypatch, capfd):
    calls = []
    overlapped = RolloutStep.overlapped_steps
    monkeypatch.setattr(RolloutStep, "overlapped_steps", lambda self: calls.append(1) or overlapped(self))
    keys = ["task=Breakout-v5", "world_size=1", "num_envs=4", "n_steps=16", "minibatches=1", "epochs=1"]
    keys += ["steps=128", "eval_episodes=0", "progress=false", "compile=false", "env_overlap=true"]
    launch(ppo_loop.train, prepare_train([*keys, "device=cpu", f"run_dir={tmp_path}"], None))
    assert "env_overlap: the policy acts on half of the 4 games" in capfd.readouterr().err
    assert len(calls) == 2 and [r["step"] for r in read_metrics(tmp_path)][-1] == 128


# -- the Nature CNN ----------------------------------------------------------------------------------------


def test_nature_cnn_shapes_init_and_pixel_scaling():
    agent = atari_fns.nature_cnn_agent()
    trunk = agent.trunk
    assert isinstance(trunk, NatureCNN)
    convs = [m for m in trunk.convs if isinstance(m, torch.nn.Conv2d)]
    assert [tuple(c.weight.shape) for c in convs] == [(32, 4, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3)]
    assert [c.stride for c in convs] == [(4, 4), (2, 2), (1, 1)]
    assert tuple(trunk.head[0].weight.shape) == (512, 64 * 7 * 7)
    # orthogonal (CleanRL's layer_init): rows orthogonal with norm = gain; biases 0
    for layer, gain in [*((c, math.sqrt(2)) for c in convs), (trunk.head[0], math.sqrt(2))]:
        w = layer.weight.flatten(1)
        torch.testing.assert_close(w @ w.T, gain**2 * torch.eye(w.shape[0]), atol=1e-4, rtol=0)
        assert not layer.bias.any()
    for head, gain in ((agent.actor, 0.01), (agent.critic, 1.0)):
        w = head.weight
        torch.testing.assert_close(w @ w.T, gain**2 * torch.eye(w.shape[0]), atol=1e-6, rtol=0)
    obs = torch.randint(0, 256, (3, 4, 84, 84)).float()
    out = agent(obs)
    assert out.action.shape == out.log_prob.shape == out.value.shape == (3,)
    assert agent.actor(trunk(obs)).shape == (3, atari_fns.ACTIONS)
    torch.testing.assert_close(trunk(obs), trunk.head(trunk.convs(obs / 255.0)))  # pixels in [0, 255]
    with pytest.raises(ValueError, match="at least 36x36"):
        NatureCNN((4, 32, 32))
    with pytest.raises(ValueError, match="needs C x H x W"):
        ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), policy="nature_cnn")


def test_nature_cnn_is_refused_with_sizes_or_vector_observations():
    with pytest.raises(UsageError, match="hidden_sizes size the mlp and cnn policies; policy=nature_cnn"):
        load_config(["task=Pong-v5", "env_backend=gymnasium", "hidden_sizes=[64]", "world_size=1"]).check()
    with pytest.raises(UsageError, match="policy=nature_cnn needs C x H x W observations; CartPole-v1"):
        load_config(["policy=nature_cnn", "world_size=1"]).check()


# -- data parallel: 2 ranks on halves == one process on the whole batch ------------------------------------


@pytest.fixture(scope="module")
def frames_batch(tmp_path_factory):
    """32 samples of real Pong frames (random play), scored by the initial policy."""
    env = AtariVecEnv("Pong-v5", 4, seed=3, training=True, backend="gymnasium")
    g = torch.Generator().manual_seed(7)
    obs = [env.reset()]
    obs += [env.step(torch.randint(0, 6, (4,), generator=g))[0] for _ in range(7)]
    env.close()
    obs = torch.cat(obs)
    actions = torch.randint(0, 6, (32,), generator=g)
    with torch.no_grad():
        out = atari_fns.nature_cnn_agent()(obs, actions)
    batch = {
        "obs": obs,
        "actions": actions,
        "log_probs": out.log_prob,
        "values": out.value,
        "advantages": torch.randn(32, generator=g),
        "returns": out.value + torch.randn(32, generator=g),
    }
    path = tmp_path_factory.mktemp("atari") / "batch.pt"
    torch.save(batch, path)
    return str(path)


@pytest.mark.slow
def test_two_ranks_equal_one_process_on_atari_frames(tmp_path, frames_batch):
    """The preset's update (per-minibatch advantages, value clip, grad clip, entropy) with the
    Nature CNN: 2 gloo ranks, each on half the frames, end with one process's weights."""

    def learn(world_size: int) -> list[dict]:
        out = tmp_path / f"w{world_size}"
        out.mkdir()
        keys = ["task=Pong-v5", f"world_size={world_size}", "num_envs=4", "n_steps=8", "epochs=3"]
        cfg = load_config([*keys, f"batch_size={32 // world_size}", "lr=0.001", "dist_timeout=60"])
        launch(functools.partial(atari_fns.ppo_learn_cnn, out=str(out), batch_path=frames_batch), cfg)
        return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]

    one, two = learn(1), learn(2)
    start = atari_fns.nature_cnn_agent().state_dict()
    assert max((one[0]["params"][k] - start[k]).abs().max() for k in start) > 1e-4  # the update moved them
    for k in start:
        torch.testing.assert_close(two[0]["params"][k], one[0]["params"][k], rtol=1e-4, atol=1e-6, msg=k)
        assert torch.equal(two[0]["params"][k], two[1]["params"][k]), k


# -- end to end --------------------------------------------------------------------------------------------


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("world_size, backend", [(1, "auto"), (2, "gymnasium")])
@pytest.mark.slow
def test_train_on_one_and_two_ranks_then_eval_and_video(tmp_path, world_size, backend):
    run_dir = tmp_path / "run"
    # Games cut at 20 agent steps: episodes end in a tiny budget, evaluation takes seconds.
    keys = ["steps=128", "num_envs=4", "n_steps=32", "epochs=1", "eval_episodes=2", "env_kwargs.max_episode_steps=20"]
    keys += [f"world_size={world_size}", f"env_backend={backend}", f"run_dir={run_dir}"]
    res = run_cli(["train", "task=Pong-v5", *keys])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = metrics(run_dir)
    assert rows[-1]["step"] == 128 and rows[-1]["eval/episodes"] == 2
    returns = [r["train/episode_return"] for r in rows if "train/episode_return" in r]
    assert returns and all(-21 <= r <= 21 for r in returns)  # whole (cut) games' raw Pong scores
    assert rows[-1]["eval/length_mean"] == 20
    if world_size == 1:
        video = tmp_path / "pong.gif"
        res = run_cli(["eval", f"checkpoint={run_dir}", "episodes=2", f"video={video}"])
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "episodes=2" in res.stdout and video.stat().st_size > 0


# -- without the packages ----------------------------------------------------------------------------------


def test_install_message_names_what_each_backend_lacks():
    only_gym = {"ale_py", "cv2"}.__contains__
    assert missing_packages("auto", only_gym) == [] and missing_packages("envpool", only_gym) == ["envpool"]
    assert missing_packages("auto", lambda module: False) == ["envpool", "ale-py", "opencv-python-headless"]
    line = install_message("Breakout-v5", "gymnasium", ["ale-py"])
    assert line == (
        "task=Breakout-v5 is an Atari game: env_backend=gymnasium needs ale-py with opencv (missing: ale-py); "
        'pip install -e ".[atari]"'
    )


def test_without_the_packages_an_atari_task_is_refused_in_one_line_before_any_process(tmp_path):
    # A module set to None in sys.modules cannot be imported (nor found): as if not installed.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules.update(envpool=None, ale_py=None)\n")
    env = cli_env() | {"PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "ddprl", "train", "task=ALE/Breakout-v5", "world_size=2"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "ddprl: error: task=ALE/Breakout-v5 is an Atari game: env_backend=auto needs EnvPool, or ale-py with "
        'opencv (missing: envpool, ale-py); pip install -e ".[atari]"'
    ]


@pytest.mark.skipif(not HAS_ENVPOOL or importlib.util.find_spec("jax") is None, reason="needs envpool and jax")
def test_an_envpool_game_is_made_without_importing_jax_which_still_imports_after():
    code = (
        "import sys\n"
        "from ddprl.envs import make_env\n"
        "env = make_env('Pong-v5', 2, seed=0, device='cpu', backend='envpool')\n"
        "print(env.single_observation_space.shape, 'jax' in sys.modules)\n"
        "import jax.numpy\n"
        "print(int(jax.numpy.ones(2).sum()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split("\n")[:2] == ["(4, 84, 84) False", "2"], out.stdout + out.stderr
