"""The multi-agent adapters (LBF, RWARE, MPE, VMAS, SMAX) against the contract of ``envs/marl/base.py``.

Small num_envs and short time limits keep the file fast on 2 CPU cores; semantics that need a
whole episode (LBF's 50 steps, RWARE's 500) run at the registered limit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import ddprl.envs.marl as marl
from ddprl.envs.marl import MAObs, check_marl_task, make_marl_env
from ddprl.errors import UsageError

LBF = "Foraging-8x8-2p-2f-coop-v3"
RWARE = "rware-tiny-2ag-v2"
MPE = "simple_speaker_listener_v4"
VMAS = "vmas/balance"
SMAX = "smax/3m"
needs_jaxmarl = pytest.mark.skipif(
    importlib.util.find_spec("jaxmarl") is None, reason="jaxmarl (Python 3.11+) is not installed"
)
TASKS = [LBF, RWARE, MPE, VMAS, pytest.param(SMAX, marks=needs_jaxmarl)]


def random_actions(obs: MAObs, gen: torch.Generator) -> torch.Tensor:
    n, a, u = obs.avail.shape
    return torch.multinomial(obs.avail.reshape(n * a, u).float(), 1, generator=gen).reshape(n, a)


@pytest.mark.parametrize("task", TASKS)
def test_shapes_dtypes_and_devices(task):
    env = make_marl_env(task, num_envs=3, seed=0)
    n, a, o, s, u = 3, env.n_agents, env.obs_dim, env.state_dim, env.n_actions
    obs = env.reset()
    assert [tuple(t.shape) for t in obs[:4]] == [(n, a, o), (n, s), (n, a, u), (n,)]
    assert [t.dtype for t in obs[:4]] == [torch.float32, torch.float32, torch.bool, torch.bool]
    assert obs.full is None  # only asked for (SMAX's full_obs=True)
    assert obs.first.all() and obs.avail.any(-1).all()
    obs, reward, terminated, truncated, info = env.step(random_actions(obs, torch.Generator().manual_seed(0)))
    assert reward.shape == (n,) and reward.dtype == torch.float32
    assert terminated.dtype == truncated.dtype == torch.bool and terminated.shape == truncated.shape == (n,)
    assert isinstance(info["final_obs"], MAObs) and info["final_obs"].obs.shape == (n, a, o)
    assert info["episode_return"].dtype == torch.float32 and info["episode_length"].dtype == torch.int64
    for key in env.extra_info_keys:
        assert info[key].shape == (n,)
    tensors = [*obs[:4], reward, terminated, truncated, info["episode_return"], info["episode_length"]]
    assert all(t.device == env.device == torch.device("cpu") for t in tensors)
    env.close()


@pytest.mark.parametrize("task", TASKS)
def test_seeded_reset_is_reproducible(task):
    first, second = make_marl_env(task, 2, seed=0), make_marl_env(task, 2, seed=0)
    a, b = first.reset(seed=7), second.reset(seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4], strict=True))
    other = second.reset(seed=8)
    assert not torch.equal(a.state, other.state)
    if task != VMAS:  # VMAS seeds its batch as one stream (see envs/marl/vmas_env.py)
        assert torch.equal(a.obs[1], other.obs[0])  # env i is seeded seed + i


@pytest.mark.parametrize("task", TASKS)
def test_auto_reset_in_the_same_step_with_episode_statistics(task):
    limit = 6
    env = make_marl_env(task, 3, seed=1, time_limit=limit)
    assert env.episode_limit == limit
    gen = torch.Generator().manual_seed(1)
    obs = env.reset()
    ret, length, ended = torch.zeros(3), torch.zeros(3, dtype=torch.int64), 0
    for _ in range(2 * limit + 1):
        obs, reward, terminated, truncated, info = env.step(random_actions(obs, gen))
        ret += reward
        length += 1
        done = terminated | truncated
        assert not (terminated & truncated).any()
        assert torch.equal(obs.first, done)
        assert (length[truncated] == limit).all()  # nothing else cuts an episode here
        if done.any():
            ended += int(done.sum())
            torch.testing.assert_close(info["episode_return"][done], ret[done])
            assert torch.equal(info["episode_length"][done], length[done])
            final = info["final_obs"]
            assert not torch.equal(final.state[done], obs.state[done])  # the old episode's last step
            assert not final.first[done].any()
        ret[done], length[done] = 0, 0
    assert ended >= 6


def test_lbf_step_limit_with_food_left_is_truncation():
    env = make_marl_env(LBF, 4, seed=0)
    gen = torch.Generator().manual_seed(0)
    obs, truncations = env.reset(), 0
    for _ in range(env.episode_limit):
        obs, _, terminated, truncated, info = env.step(random_actions(obs, gen))
        done = terminated | truncated
        # A full-sight agent sees every food as (row, col, level); level > 0 is food left.
        food_left = (info["final_obs"].obs[:, 0, 2:6:3] > 0).any(-1)
        assert torch.equal(truncated, done & food_left)
        assert torch.equal(terminated, done & ~food_left)
        assert torch.equal(info["episode_success"][done], terminated[done].float())
        assert (info["episode_length"][truncated] == 50).all()
        truncations += int(truncated.sum())
    assert truncations > 0


def test_lbf_all_food_eaten_on_the_last_step_is_termination():
    env = make_marl_env("Foraging-8x8-2p-1f-coop-v3", 2, seed=0)
    env.reset()
    stay = torch.zeros(2, 2, dtype=torch.int64)
    for _ in range(env.episode_limit - 1):
        env.step(stay)  # NONE never eats
    lbf = env.envs[0].env
    lbf.field[:] = 0
    lbf.field[3, 3] = 2
    lbf.players[0].position, lbf.players[1].position = (3, 2), (3, 4)
    lbf.players[0].level = lbf.players[1].level = 1
    lbf._gen_valid_moves()
    load = torch.tensor([[5, 5], [0, 0]])
    obs, reward, terminated, truncated, info = env.step(load)
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, True]
    assert info["episode_success"].tolist() == [1.0, 0.0] and info["episode_length"].tolist() == [50, 50]
    assert reward[0] > 0 and obs.first.all()


def test_lbf_action_masks_are_lbf_valid_actions():
    plain = make_marl_env(LBF, 2, seed=0)
    assert plain.reset().avail.all()  # EPyMARL's default: every action available
    env = make_marl_env(LBF, 2, seed=0, action_masks=True)
    obs, gen, masked = env.reset(), torch.Generator().manual_seed(0), 0
    for _ in range(20):
        for i, one in enumerate(env.envs):
            for j, player in enumerate(one.env.players):
                valid = [a.value for a in one.env._make_obs(player).actions]  # LBF's per-agent view
                assert obs.avail[i, j].nonzero().flatten().tolist() == valid
        masked += int((~obs.avail).sum())
        obs, *_ = env.step(random_actions(obs, gen))
    assert masked > 0


def test_lbf_five_food_ids_are_registered():
    for task in [
        "Foraging-15x15-3p-5f-v3",
        "Foraging-15x15-4p-5f-v3",
        "Foraging-2s-10x10-3p-5f-coop-v3",
        "Foraging-10x10-3p-9f-v3",
    ]:
        check_marl_task(task)  # imports ddprl's LBF module, which registers them (in any test order)
        assert task in gym.registry
    env = make_marl_env("Foraging-15x15-4p-5f-v3", 2, seed=0)
    assert env.obs_dim == 3 * 5 + 3 * 4 and env.reset().obs.shape == (2, 4, 27)
    from ddprl.envs.marl.lbf import register_more_food

    register_more_food()  # idempotent: no re-registration warnings or errors


def test_rware_step_limit_is_truncation():
    env = make_marl_env(RWARE, 2, seed=0)
    assert env.episode_limit == 500
    gen, obs = torch.Generator().manual_seed(0), env.reset()
    for t in range(1, 501):
        obs, _, terminated, truncated, info = env.step(random_actions(obs, gen))
        assert not terminated.any()
        assert truncated.all() == (t == 500) and truncated.any() == (t == 500)
    assert info["episode_length"].tolist() == [500, 500] and obs.first.all()


def test_mpe_truncates_at_max_cycles_and_sums_agent_rewards():
    from mpe2 import simple_spread_v3

    env = make_marl_env("simple_spread_v3", 2, seed=3)
    raw = simple_spread_v3.parallel_env(continuous_actions=False)
    obs, _ = env.reset(), raw.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 26):
        actions = random_actions(obs, gen)
        obs, reward, terminated, truncated, _ = env.step(actions)
        _, raw_rewards, _, _, _ = raw.step(dict(zip(raw.possible_agents, actions[0].tolist(), strict=True)))
        assert reward[0].item() == pytest.approx(sum(raw_rewards.values()), rel=1e-6)
        assert not terminated.any() and truncated.all() == (t == 25)
    assert obs.first.all()


def test_mpe_success_on_the_last_step_is_termination():
    env = make_marl_env("simple_spread_v3", 2, seed=0, terminate_on_success=True, time_limit=1)
    env.reset()
    world = env.envs[0].raw.world
    for agent, landmark in zip(world.agents, world.landmarks, strict=True):  # every landmark covered, at rest
        agent.state.p_pos, agent.state.p_vel = landmark.state.p_pos.copy(), agent.state.p_vel * 0
    obs, _, terminated, truncated, _ = env.step(torch.zeros(2, 3, dtype=torch.int64))
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, True] and obs.first.all()


def test_mpe_pads_heterogeneous_agents():
    env = make_marl_env(MPE, 2, seed=0)  # speaker: 3 obs, 3 actions; listener: 11 obs, 5 actions
    obs = env.reset()
    assert (env.n_actions, env.obs_dim, env.state_dim) == (5, 11, 14)
    assert obs.avail[:, 0].tolist() == [[True, True, True, False, False]] * 2 and obs.avail[:, 1].all()
    assert (obs.obs[:, 0, 3:] == 0).all() and (obs.obs[:, 0, :3] != 0).any()
    torch.testing.assert_close(obs.state, torch.cat([obs.obs[:, 0, :3], obs.obs[:, 1]], dim=1))


@pytest.mark.parametrize(
    "task, native",
    [
        (LBF, "max_episode_steps"),
        (RWARE, "max_steps"),
        ("simple_spread_v3", "max_cycles"),
        (VMAS, "max_steps"),
    ],
)
def test_time_limit_sets_episode_limit_and_truncation(task, native):
    env = make_marl_env(task, 2, seed=0, time_limit=4)
    assert env.episode_limit == 4
    obs, gen = env.reset(), torch.Generator().manual_seed(0)
    for t in range(1, 5):
        obs, _, terminated, truncated, _ = env.step(random_actions(obs, gen))
        assert (terminated | truncated).all() == (t == 4)
    assert make_marl_env(task, 1, seed=0, **{native: 9}).episode_limit == 9
    with pytest.raises(UsageError, match="not both"):
        make_marl_env(task, 1, seed=0, time_limit=4, **{native: 4})


def test_vmas_termination_resets_only_that_env():
    env = make_marl_env(VMAS, 3, seed=0)
    obs = env.reset()
    scenario = env.env.scenario
    scenario.package.set_pos(scenario.package.goal.state.pos[0], batch_index=0)  # package on its goal
    obs, _, terminated, truncated, info = env.step(torch.zeros(3, env.n_agents, dtype=torch.int64))
    assert terminated.tolist() == [True, False, False] and not truncated.any()
    assert obs.first.tolist() == [True, False, False]
    assert not torch.equal(info["final_obs"].obs[0], obs.obs[0])
    assert torch.equal(info["final_obs"].obs[1:], obs.obs[1:])


@needs_jaxmarl
def test_smax_win_terminates_and_counts_once():
    """Enemies at a sliver of health, allies attacking them: the battle is won at once, terminated,
    with the team reward once (damage dealt plus SMAX's win bonus of 1)."""
    env = make_marl_env(SMAX, 2, seed=0)
    obs = env.reset()
    battles = env._state.state
    allies = env.n_agents
    health = battles.unit_health.at[:, allies:].set(1e-3)
    env._state = env._state.replace(state=battles.replace(unit_health=health))
    close = battles.unit_positions.at[:, allies:].set(battles.unit_positions[:, :1] + 0.5)  # within range
    env._state = env._state.replace(state=env._state.state.replace(unit_positions=close))
    attack = (5 + torch.arange(allies)).expand(2, allies)  # after SMAX's 5 moves: ally i attacks enemy i
    obs, reward, terminated, truncated, info = env.step(attack)
    assert terminated.all() and not truncated.any() and obs.first.all()
    assert info["episode_won"].tolist() == [1.0, 1.0]
    assert (reward > 1.0).all() and (reward < 1.1).all()  # the bonus counted once, not per agent
    assert not info["final_obs"].first.any()


@needs_jaxmarl
def test_smax_time_limit_counts_steps():
    """SMAX's own max_steps=M ends a battle after M + 1 steps; time_limit=T after T."""
    assert make_marl_env(SMAX, 1, seed=0).episode_limit == 101
    assert make_marl_env(SMAX, 1, seed=0, max_steps=9).episode_limit == 10
    env = make_marl_env(SMAX, 2, seed=0, time_limit=4)
    env.reset()
    stop = torch.zeros(2, env.n_agents, dtype=torch.int64) + 4  # SMAX's stop: no battle ends by itself
    for t in range(1, 5):
        _, _, terminated, truncated, _ = env.step(stop)
        assert truncated.all() == (t == 4) and not terminated.any()
    with pytest.raises(UsageError, match="not both"):
        make_marl_env(SMAX, 1, seed=0, time_limit=4, max_steps=4)


@needs_jaxmarl
def test_smax_unknown_scenario_and_render():
    with pytest.raises(UsageError, match="did you mean smax/3m"):
        check_marl_task("smax/3n")
    env = make_marl_env("smax/2s3z", 1, seed=0)
    env.reset()
    frame = env.render_rgb()
    assert frame.dtype == np.uint8 and frame.shape[2] == 3 and frame.std() > 0


def test_unknown_tasks_and_missing_packages(monkeypatch):
    with pytest.raises(UsageError, match="did you mean Foraging-8x8-2p-2f-coop-v3"):
        check_marl_task("Foraging-8x8-2p-2f-coop-v2")
    with pytest.raises(UsageError, match="did you mean simple_spread_v3"):
        check_marl_task("simple_sprad_v3")
    with pytest.raises(UsageError, match="did you mean vmas/balance"):
        make_marl_env("vmas/balanse", 1, seed=0)
    with pytest.raises(UsageError, match="unknown multi-agent task 'CartPole-v1'"):
        check_marl_task("CartPole-v1")
    monkeypatch.setattr(marl, "_installed", lambda family: False)
    with pytest.raises(UsageError, match="pip install rware"):
        check_marl_task(RWARE)


@pytest.mark.parametrize(
    "task, kwargs, message",
    [
        (LBF, {"penalti": 0.1}, "unknown env kwargs penalti; accepted: time_limit, players"),
        (RWARE, {"msg_bits": 2}, "msg_bits"),
        ("simple_spread_v3", {"continuous_actions": True}, "unknown env kwargs continuous_actions"),
        (VMAS, {"n_agnets": 3}, "not all used by the scenario"),
        (VMAS, {"continuous_actions": True}, "set by ddprl"),
        (LBF, {"time_limit": 0}, "positive int"),
    ],
)
def test_bad_kwargs_are_usage_errors(task, kwargs, message):
    with pytest.raises(UsageError, match=message):
        make_marl_env(task, 1, seed=0, **kwargs)


@pytest.mark.parametrize("task", [LBF, RWARE, MPE, VMAS])
def test_render_rgb_without_a_display(task, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    env = make_marl_env(task, 2, seed=0)
    env.reset()
    try:
        frame = env.render_rgb()
    except Exception as e:  # VMAS renders through pyglet/EGL, which a machine may lack
        if task == VMAS:
            pytest.skip(f"VMAS cannot render here: {e}")
        raise
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.std() > 0


# -- SMAC (StarCraft II): against tests/smac_standin, which has SMAC's API over a tiny battle --------

STANDIN = Path(__file__).parent / "smac_standin"


@pytest.fixture
def smac_standin(monkeypatch, tmp_path):
    """The stand-in ``smac`` importable and a StarCraft II folder at SC2PATH, for one test."""
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("SC2PATH", str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "smac" or m.startswith("smac.")]:
        del sys.modules[name]


def test_smac_refused_without_the_package_or_the_game(monkeypatch, tmp_path):
    if importlib.util.find_spec("smac") is None:
        with pytest.raises(UsageError, match="needs the smac package"):
            check_marl_task("sc2/3m")
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("SC2PATH", str(tmp_path / "no-game-here"))
    with pytest.raises(UsageError, match="need StarCraft II with the SMAC maps; none at .*no-game-here"):
        check_marl_task("sc2/3m")


def test_smac_adapter_wins_truncates_and_seeds(smac_standin):
    with pytest.raises(UsageError, match="did you mean sc2/3m"):
        check_marl_task("sc2/3n")
    env = make_marl_env("sc2/3m", 2, seed=0)
    assert (env.n_agents, env.n_actions, env.episode_limit, env.extra_info_keys) == (3, 9, 60, ("episode_won",))
    obs = env.reset()
    assert obs.obs.shape == (2, 3, env.obs_dim) and obs.state.shape == (2, 6) and obs.avail.shape == (2, 3, 9)
    assert torch.equal(env.reset(seed=1).obs[0], make_marl_env("sc2/3m", 1, seed=1).reset().obs[0])
    obs = env.reset(seed=0)
    assert torch.equal(obs.obs[1], make_marl_env("sc2/3m", 1, seed=1).reset().obs[0])  # env i: seed + i
    # Focus fire on the first enemy alive (3 allies x 1 of its 3 hit points a step): a win in 3 steps.
    for _ in range(3):
        target = 6 + int(obs.avail[0, 0, 6:].int().argmax())
        obs, reward, terminated, truncated, info = env.step(torch.where(obs.avail[..., target], target, 0))
        assert (reward > 0).all()
    assert terminated.all() and not truncated.any() and obs.first.all()
    assert info["episode_won"].tolist() == [1.0, 1.0] and info["episode_length"].tolist() == [3, 3]
    # Standing still until the limit: neither side wiped out, so truncated (SMAC says only "terminated").
    stop = torch.ones(2, 3, dtype=torch.int64)
    for _ in range(env.episode_limit):
        alive = obs.avail[..., 1]  # the dead may only no-op (action 0)
        obs, _, terminated, truncated, info = env.step(torch.where(alive, stop, 0))
        if (terminated | truncated).any():
            break
    assert (terminated | truncated).all() and not info["episode_won"].any()
    assert truncated.all() == (info["episode_length"] == env.episode_limit).all()
    frame = env.envs[0].render_rgb()
    assert frame.dtype == np.uint8 and frame.shape[2] == 3


@pytest.mark.slow
def test_smac_qmix_trains_through_the_cli(smac_standin, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]))
    run_dir = tmp_path / "run"
    keys = ["algo=qmix", "task=sc2/3m", "world_size=1", "num_envs=2", "steps=600", "batch_size=4", "log_freq=200"]
    keys += ["eval_freq=600", "eval_episodes=4", "progress=false", f"run_dir={run_dir}"]
    res = subprocess.run(
        [sys.executable, "-m", "ddprl", "train", *keys], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/won_mean" in row for row in rows)
    assert "use_rnn: true  # task preset" in (run_dir / "config.yaml").read_text()
