"""TD-MPC2's schedule alone: counters and decisions, hand-computed, for a fresh run, a run resumed
during seeding, one resumed after the pretraining burst, several ranks, and a resume from the
schedule's own checkpoint counters. No env, no model: runs in well under a second."""

from __future__ import annotations

from typing import NamedTuple

from ddprl.algos.tdmpc2.schedule import Schedule
from ddprl.config import load_config

EPISODE_LENGTH = 50


def config(*overrides: str, world_size: int = 1):
    return load_config(
        [
            "algo=tdmpc2",
            "task=cartpole-balance",
            f"world_size={world_size}",
            "device=cpu",
            "log_freq=1000",
            "eval_freq=0",
            "eval_episodes=0",
            "checkpoint_freq=0",
            *overrides,
        ]
    )


def schedule(*overrides: str, world_size: int = 1, **resume) -> Schedule:
    return Schedule.for_run(config(*overrides, world_size=world_size), world_size, EPISODE_LENGTH, **resume)


class Row(NamedTuple):
    step: int  # global step after the agent step
    random: bool  # its actions were random
    burst: int | None  # micro-batches owed when learning started at this step (None: it did not)
    updates: int  # optimizer steps made at this step
    log: bool
    eval: bool
    checkpoint: bool


def drive(s: Schedule, num_steps: int | None = None, ready_from: int = 0) -> list[Row]:
    """What the loop asks, step by step; every rank's buffer can be sampled from global step
    ``ready_from`` on (the loop's collective)."""
    rows = []
    while not s.done and (num_steps is None or len(rows) < num_steps):
        random = s.acts_randomly
        s.advance()
        burst = s.start_learning() if s.may_start_learning and s.step >= ready_from else None
        rows.append(Row(s.step, random, burst, s.take_updates(), s.log_due, s.eval_due, s.checkpoint_due))
    return rows


def column(rows: list[Row], name: str) -> list:
    return [getattr(r, name) for r in rows]


def test_default_seed_steps_give_every_rank_the_papers_random_steps():
    # max(1000, 5 x 50) per rank; with 500-step episodes max(1000, 2500)
    assert schedule(world_size=1).seed_steps == 1000
    assert schedule(world_size=2).seed_steps == 2000
    assert Schedule.for_run(config(world_size=2), 2, 500).seed_steps == 5000
    assert schedule("seed_steps=7", world_size=2).seed_steps == 7


def test_fresh_run():
    s = schedule("seed_steps=4", "steps=8", "log_freq=2", "eval_freq=4", "eval_episodes=1", "checkpoint_freq=3")
    assert (s.step, s.updates, s.pretrained, s.random_until, s.learn_from, s.local_steps, s.learning, s.micro_due) == (
        0,
        0,
        False,
        4,
        4,
        0,
        False,
        0,
    )
    rows = drive(s)
    assert column(rows, "step") == [1, 2, 3, 4, 5, 6, 7, 8]
    assert column(rows, "random") == [True] * 4 + [False] * 4
    # the burst: one update per transition collected (4), then one per agent step
    assert column(rows, "burst") == [None, None, None, 4, None, None, None, None]
    assert column(rows, "updates") == [0, 0, 0, 4, 1, 1, 1, 1]
    assert [r.step for r in rows if r.log] == [2, 4, 6, 8]
    assert [r.step for r in rows if r.eval] == [4, 8]
    assert [r.step for r in rows if r.checkpoint] == [3, 6, 8]  # and always the last step
    assert s.counters() == {"updates": 8, "pretrained": True, "micro_due": 0}


def test_burst_waits_for_every_rank_to_hold_an_episode():
    # buffers sampleable only from step 6: the agent acts meanwhile, the burst then counts all 6
    rows = drive(schedule("seed_steps=4", "steps=8"), ready_from=6)
    assert column(rows, "random") == [True] * 4 + [False] * 4
    assert column(rows, "burst") == [None] * 5 + [6, None, None]
    assert column(rows, "updates") == [0, 0, 0, 0, 0, 6, 1, 1]


def test_several_ranks_count_global_steps_and_owe_local_updates():
    # 2 ranks x 2 envs: each agent step is 4 global steps and 2 transitions per rank
    s = schedule(
        "num_envs=4", "seed_steps=8", "steps=16", "updates_per_step=2", "sync_freq=3", "log_freq=6", world_size=2
    )
    assert (s.num_envs, s.local_num_envs, s.random_until, s.learn_from) == (4, 2, 8, 8)
    rows = drive(s)
    assert column(rows, "step") == [4, 8, 12, 16]
    assert s.local_steps == 8
    assert column(rows, "random") == [True, True, False, False]
    # burst: 4 local transitions x 2 = 8 micro-batches = 2 optimizer steps of 3, 2 carried;
    # then 2 x 2 = 4 per agent step: 6 -> 2 steps, then 4 -> 1 step, 1 left owed
    assert column(rows, "burst") == [None, 8, None, None]
    assert column(rows, "updates") == [0, 2, 2, 1]
    assert (s.updates, s.micro_due) == (5, 1)
    assert [r.step for r in rows if r.log] == [8, 12, 16]  # crossed 6 and 12, and the last step


def test_resumed_during_seeding_without_buffers_seeds_again():
    s = schedule("seed_steps=8", "steps=16", step=6, counters={"updates": 0, "pretrained": False})
    assert (s.step, s.updates, s.pretrained, s.random_until, s.learn_from, s.local_steps, s.learning) == (
        6,
        0,
        False,
        14,
        14,
        0,
        False,
    )
    rows = drive(s)
    assert column(rows, "random") == [True] * 8 + [False] * 2  # steps 7..14 random again
    assert column(rows, "burst") == [None] * 7 + [8, None, None]  # the 8 transitions since the resume
    assert column(rows, "updates") == [0] * 7 + [8, 1, 1]
    assert s.counters() == {"updates": 10, "pretrained": True, "micro_due": 0}


def test_resumed_during_seeding_with_buffers_goes_on_seeding():
    # checkpoint at step 6: the buffer holds the 5 transitions of ended episodes (the running one is lost)
    s = schedule("seed_steps=8", "steps=16", step=6, counters={"updates": 0, "pretrained": False}, restored=5)
    assert (s.random_until, s.learn_from, s.local_steps, s.learning) == (8, 8, 5, False)
    rows = drive(s)
    assert column(rows, "random") == [True, True] + [False] * 8
    assert column(rows, "burst") == [None, 7] + [None] * 8  # 5 restored + 2 new transitions
    assert column(rows, "updates") == [0, 7] + [1] * 8
    assert s.updates == 15


def test_resumed_after_the_burst_without_buffers_refills_with_the_agents_actions():
    s = schedule("seed_steps=4", "steps=16", step=10, counters={"updates": 9, "pretrained": True})
    assert (s.step, s.updates, s.pretrained, s.random_until, s.learn_from, s.local_steps, s.learning) == (
        10,
        9,
        True,
        10,
        14,
        0,
        False,
    )
    rows = drive(s)
    assert column(rows, "random") == [False] * 6
    assert column(rows, "burst") == [None, None, None, 0, None, None]  # no second burst
    assert column(rows, "updates") == [0, 0, 0, 0, 1, 1]
    assert s.counters() == {"updates": 11, "pretrained": True, "micro_due": 0}


def test_resumed_after_the_burst_with_buffers_updates_at_once():
    s = schedule("seed_steps=4", "steps=16", step=10, counters={"updates": 9, "pretrained": True}, restored=10)
    assert (s.random_until, s.learning, s.micro_due) == (10, True, 0)
    rows = drive(s)
    assert column(rows, "random") == [False] * 6
    assert column(rows, "burst") == [None] * 6
    assert column(rows, "updates") == [1] * 6
    assert s.updates == 15


def test_resumed_from_its_own_counters_continues_like_an_uninterrupted_run():
    # sync_freq=3 with 2 x 2 micro-batches per agent step: one is often owed at a checkpoint
    overrides = (
        "num_envs=4",
        "seed_steps=12",
        "steps=40",
        "updates_per_step=2",
        "sync_freq=3",
        "log_freq=8",
        "checkpoint_freq=12",
    )
    whole = schedule(*overrides, world_size=2)
    expected = drive(whole)
    for k in range(len(expected) + 1):  # checkpoints during seeding, at the burst, after it, at the end
        first = schedule(*overrides, world_size=2)
        rows = drive(first, num_steps=k)
        counters = first.counters()
        assert set(counters) == {"updates", "pretrained", "micro_due"}  # the keys every checkpoint holds
        # every transition in the buffer: the checkpoint fell at episode ends
        resumed = schedule(*overrides, world_size=2, step=first.step, counters=counters, restored=first.local_steps)
        assert rows + drive(resumed) == expected, k
        assert resumed.counters() == whole.counters() and resumed.local_steps == whole.local_steps
