"""PPO's loop on 2 real ranks (gloo), checked against values computed by hand: the learning-rate
schedule, the observation and return statistics reduced over ranks, each rank's own env seeds,
and the checkpoint a SIGTERM leaves. Each job is a few seconds of CartPole."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch
from conftest import run_cli, start_job, stop_with_sigterm

from ddprl.checkpoint import load_checkpoint
from ddprl.metrics import read_metrics
from ddprl.runtime.preemption import PREEMPTED_EXIT_CODE

SEED, RANKS, ENVS, N_STEPS, ITERATIONS, LR = 3, 2, 4, 4, 5, 0.001
STEP = ENVS * N_STEPS  # global steps per iteration: 2 ranks x 2 envs x 4 steps
JOB = [
    "train",
    "task=CartPole-v1",
    f"seed={SEED}",
    f"world_size={RANKS}",
    f"num_envs={ENVS}",
    f"n_steps={N_STEPS}",
    "batch_size=8",
    "epochs=1",
    "anneal_lr=true",
    f"lr={LR}",
    "norm_obs=true",
    "norm_reward=true",
    "eval_episodes=0",
    "progress=false",
    "device=cpu",
    "compile=false",  # eager, as these runs are short whatever their budget
    "dist_timeout=60",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    res = run_cli(
        [
            *JOB,
            f"steps={ITERATIONS * STEP}",
            f"checkpoint_freq={STEP}",
            "keep_last=0",
            "eval_episodes=2",
            "eval_freq=0",
            f"run_dir={run_dir}",
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


def test_learning_rate_anneals_linearly_to_zero_over_the_iterations(run):
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [STEP * (i + 1) for i in range(ITERATIONS)]
    assert rows[-1]["eval/episodes"] == 2 and rows[-1]["eval/return_mean"] >= 8  # the last row evaluates
    assert not any("eval/episodes" in r for r in rows[:-1])  # eval_freq=0: only the last
    # iteration i trains with lr * (1 - i / N): the first at lr, the last at lr / N
    expected = [LR * (1 - i / ITERATIONS) for i in range(ITERATIONS)]
    assert [r["train/lr"] for r in rows] == pytest.approx(expected, rel=1e-9, abs=0)


def test_every_iteration_learns_from_its_advantages_and_times_itself(run):
    rows = read_metrics(run)
    for r in rows:  # advantages never loaded into the update (zeros) would give a policy loss of exactly 0
        assert r["train/policy_loss"] != 0.0 and r["train/value_loss"] > 0
    for before, r in zip(rows, rows[1:], strict=False):
        seconds = r["time/rollout_s"] + r["time/update_s"]  # means over ranks, within the iteration's wall time
        assert 0 < seconds <= r["wall_time"] - before["wall_time"]
        # each rank's steps over its own time, summed over ranks (equal shares): about the job's steps / time
        assert 0.5 < r["time/global_fps"] * seconds / STEP < 2


def test_statistics_count_every_ranks_steps_once(run):
    """The observation and return statistics are merged over ranks: after k iterations they have
    seen k x (steps of both ranks) samples, not one rank's half of them."""
    for k in (1, ITERATIONS):
        state = load_checkpoint(run / "checkpoints" / f"step_{k * STEP}.pt")["state"]
        assert float(state["obs_rms"]["count"]) == k * STEP
        assert float(state["reward_stats"]["count"]) == k * STEP
        assert state["scaler"] == {}  # fp32: no loss scaling (precision=fp16 only)


def _reset_rng(seed: int) -> dict:
    env = gym.make("CartPole-v1")
    env.reset(seed=seed)
    return env.unwrapped.np_random.bit_generator.state


def test_each_rank_steps_its_own_envs_seeded_seed_plus_10000_rank_plus_index(run):
    """Env i of rank r is seeded seed + 10000 r + i (global rank). CartPole draws from its RNG only
    at a reset, and no episode ends within the first iteration's 4 steps, so the RNG each rank
    saved after it is the one its env's seeded reset left."""
    ckpt = load_checkpoint(run / "checkpoints" / f"step_{STEP}.pt")
    assert ckpt["world_size"] == RANKS and len(ckpt["ranks"]) == RANKS
    local = ENVS // RANKS
    seen = []
    for rank, state in enumerate(ckpt["ranks"]):
        envs = state["env"]["envs"]
        assert len(envs) == local
        for i, env in enumerate(envs):
            assert env["elapsed"] == N_STEPS
            assert json.loads(env["rng"]) == _reset_rng(SEED + 10_000 * rank + i), (rank, i)
            seen.append(json.loads(env["rng"])["state"]["state"])
    assert len(set(seen)) == ENVS  # no two envs of the job replay the same episodes
    # and the ranks sample their actions from torch streams of their own
    assert not torch.equal(ckpt["ranks"][0]["rng"]["torch"], ckpt["ranks"][1]["rng"]["torch"])


def test_sigterm_saves_a_checkpoint_at_the_step_the_job_stopped(tmp_path):
    run_dir = tmp_path / "run"
    job = start_job([*JOB, "steps=100000000", "checkpoint_freq=0", f"run_dir={run_dir}"], tmp_path)
    err = stop_with_sigterm(job, lambda: (run_dir / "metrics.jsonl").exists() and len(read_metrics(run_dir)) >= 2, 120)
    assert job.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    ckpt = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    last = read_metrics(run_dir)[-1]["step"]
    assert ckpt["step"] == last and last % STEP == 0
    assert ckpt["counters"]["iteration"] == last // STEP
    assert float(ckpt["state"]["obs_rms"]["count"]) == last
