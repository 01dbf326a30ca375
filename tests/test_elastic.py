"""Elastic resume: a run checkpointed on 2 ranks goes on on 1 and on 4 (real gloo, real checkpoints) with its
global step, optimizer state, schedule and global batch; replays saved per rank are dealt out over the new ranks.
Each algorithm's 2-rank run is made once and copied for each resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import TDMPC2_TINY, run_cli, start_job, stop_with_sigterm

from ddprl.algos.qmix.buffer import EpisodeBuffer as EpisodeReplay
from ddprl.algos.qmix.buffer import episode_fields
from ddprl.algos.tdmpc2.buffer import EpisodeBuffer
from ddprl.checkpoint import buffer_path, load_checkpoint, restore_buffer
from ddprl.config import load_config
from ddprl.metrics import read_metrics
from ddprl.prepare import envs_for_world, same_global_batch

COMMON = ["device=cpu", "progress=false", "dist_timeout=120"]
JOBS = {  # algo: (keys, the budget, checkpoint_freq: where the 2-rank run is taken up again)
    "ppo": (["n_steps=64", "batch_size=64", "epochs=2", "eval_episodes=0", "lr=0.001"], 4096, 2048),
    "qmix": (
        [
            "algo=qmix",
            "task=Foraging-8x8-2p-2f-coop-v3",
            "num_envs=4",
            "batch_size=4",
            "buffer_size=64",
            "update_every=100",
            "log_freq=400",
            "eval_episodes=0",
            "checkpoint_buffer=true",
        ],
        4000,
        2000,
    ),
    "tdmpc2": (
        [
            "algo=tdmpc2",
            "task=cartpole-balance",
            *TDMPC2_TINY,
            "num_envs=4",
            "episode_length=50",
            "seed_steps=200",
            "log_freq=100",
            "eval_freq=0",
            "eval_episodes=0",
            "checkpoint_buffer=true",
        ],
        800,
        400,
    ),
    "supervised": (["algo=supervised", "task=digits", "batch_size=16"], 4, 2),
}
SCHEDULE = {  # what each row of metrics.jsonl says of the schedule: the same whatever the world size
    "ppo": ("step", "train/lr"),
    "qmix": ("step", "train/epsilon", "train/updates"),
    "tdmpc2": ("step", "train/updates"),
    "supervised": ("epoch", "step"),
}


def _train(algo: str, run_dir: Path, world_size: int, resume: Path | None = None, budget: int | None = None) -> str:
    keys, total, every = JOBS[algo]
    budget = f"epochs={budget or total}" if algo == "supervised" else f"steps={budget or total}"
    args = ["train", *COMMON, *keys, budget, f"checkpoint_freq={1 if algo == 'supervised' else every}"]
    args += [f"world_size={world_size}", f"run_dir={run_dir}"] + ([f"resume={resume}"] if resume else [])
    proc = run_cli(args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.fixture(scope="module", params=list(JOBS))
def two_rank_run(request, tmp_path_factory):
    """The whole 2-rank run, and a 2-rank run of it to take up halfway: its checkpoint there (replays are kept for
    the latest checkpoint only, so a run with a replay ends halfway; the others' schedules need the whole budget)."""
    algo = request.param
    root = tmp_path_factory.mktemp(f"elastic-{algo}")
    _train(algo, root / "whole", 2)
    if algo not in ("qmix", "tdmpc2"):
        return algo, root / "whole", root / "whole"
    _train(algo, root / "half", 2, budget=JOBS[algo][2])
    return algo, root / "whole", root / "half"


def _halfway(algo: str, run_dir: Path) -> Path:
    """The checkpoint of ``run_dir`` halfway through the budget."""
    _, budget, every = JOBS[algo]
    for path in sorted((run_dir / "checkpoints").glob("step_*.pt")):
        ckpt = load_checkpoint(path)
        if (ckpt["counters"]["epoch"] == budget // 2) if algo == "supervised" else ckpt["step"] == every:
            return path
    raise AssertionError(f"no checkpoint halfway in {run_dir}")


def _adam_steps(ckpt: dict) -> set[float]:
    state = ckpt["state"]
    optimizer = state.get("optimizer") or state.get("wm_optimizer") or state["learner"]["optimizer"]
    return {float(s["step"]) for s in optimizer["state"].values()}


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_two_rank_checkpoint_goes_on_at_another_world_size(two_rank_run, world_size, tmp_path):
    """Taken up halfway on 1 or 4 ranks, the run logs the rows the 2-rank run logged, with its schedule (learning
    rate, exploration, updates, epochs), and ends with as many optimizer steps in the optimizer's own state."""
    algo, whole, start = two_rank_run
    run_dir = tmp_path / "run"
    shutil.copytree(start, run_dir)
    halfway = _halfway(algo, run_dir)
    saved = load_checkpoint(halfway)
    err = _train(algo, run_dir, world_size, resume=halfway)
    ckpt, reference = (load_checkpoint(d / "checkpoints" / "latest.pt") for d in (run_dir, whole))
    assert ckpt["world_size"] == world_size and ckpt["step"] == reference["step"]
    keys = SCHEDULE[algo]
    schedule = [tuple(r.get(k) for k in keys) for r in read_metrics(run_dir) if keys[1] in r]
    expected = [tuple(r.get(k) for k in keys) for r in read_metrics(whole) if keys[1] in r]
    assert f"resuming a 2-rank run on {world_size} rank" in err, err[-3000:]
    if algo in ("qmix", "tdmpc2"):
        assert "replay re-sharded: the" in err and f"over {world_size} rank(s)" in err
    if algo == "tdmpc2":
        # One update per transition a rank collects, batch_size per rank kept: the samples learned from per
        # environment step stay, and the optimizer steps per global step follow the new world size.
        assert ckpt["config"]["batch_size"] == saved["config"]["batch_size"] and "per rank stays" in err
        assert f"resumed at step {saved['step']} after {saved['counters']['updates']} updates with the replay" in err
        half = len([row for row in schedule if row[0] <= saved["step"]])
        assert schedule[:half] == expected[:half]
        updates = [u for _, u in schedule[half - 1 :]]
        assert {b - a for a, b in zip(updates, updates[1:], strict=False)} == {100 / world_size}, schedule
        assert _adam_steps(ckpt) == {float(ckpt["counters"]["updates"])} and updates[-1] == ckpt["counters"]["updates"]
        return
    assert schedule == expected, (schedule, expected)
    batch = saved["config"]["batch_size"] * 2 // world_size  # the global batch kept
    assert ckpt["config"]["batch_size"] == batch and f"-> {batch} per rank" in err
    assert _adam_steps(ckpt) == _adam_steps(reference) and _adam_steps(saved) != _adam_steps(reference)
    if algo == "qmix":
        assert "resumed with the episode replays" in err  # updates go on at once, no warm-up


@pytest.mark.slow
def test_the_default_job_stopped_on_two_ranks_learns_cartpole_when_resumed_on_one(tmp_path):
    """The default job (PPO, CartPole-v1, 2 ranks) stopped by SIGTERM after its first checkpoint (a third of the
    way), resumed on 1 rank, reaches the default job's own target (eval return >= 475) after the resume.

    "Reaches", as the JAX engine's learning test and the benchmark's time-to-475: where the stop lands depends on
    timing, and PPO's greedy CartPole return oscillates after it first hits 500, so the last evaluation alone would
    be a coin toss."""
    run_dir = tmp_path / "d"
    job = start_job(["train", f"run_dir={run_dir}", "progress=false"], cwd=tmp_path)
    err = stop_with_sigterm(job, lambda: bool(list(run_dir.glob("checkpoints/step_*.pt"))), 600)
    assert job.returncode == 75, err[-3000:]
    stopped_at = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"]
    res = run_cli(["train", f"run_dir={run_dir}", "resume=auto", "world_size=1", "progress=false"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming a 2-rank run on 1 rank" in res.stderr
    after = [r for r in read_metrics(run_dir) if "eval/return_mean" in r and r["step"] > stopped_at]
    assert len(after) >= 3 and all(r["eval/episodes"] == 10 for r in after)
    assert max(r["eval/return_mean"] for r in after) >= 475, [(r["step"], r["eval/return_mean"]) for r in after]


# -- pieces --------------------------------------------------------------------------------------


def _qmix_replay(capacity: int) -> EpisodeReplay:
    return EpisodeReplay(capacity, episode_fields(3, 2, 4, 5, 3), "cpu")


def _qmix_episodes(first: int, n: int) -> dict[str, torch.Tensor]:
    fields = episode_fields(3, 2, 4, 5, 3)
    out = {name: torch.zeros((n, *shape), dtype=dtype) for name, (shape, dtype) in fields.items()}
    out["reward"][:] = torch.arange(first, first + n, dtype=torch.float32)[:, None]  # the episode's number
    out["filled"][:] = True
    return out


def test_a_wrapped_ring_gives_its_episodes_oldest_first_and_extend_adds_them_in_order():
    replay = _qmix_replay(4)
    replay.add(_qmix_episodes(0, 6))  # 0, 1 overwritten: the ring holds 4, 5, 2, 3 with 2 the oldest
    numbers = [int(e["reward"][0]) for e in EpisodeReplay.episodes_of(replay.state_dict())]
    assert numbers == [2, 3, 4, 5]
    fresh = _qmix_replay(3)
    fresh.extend(EpisodeReplay.episodes_of(replay.state_dict()))  # one too many: the oldest goes
    assert [int(e["reward"][0]) for e in EpisodeReplay.episodes_of(fresh.state_dict())] == [3, 4, 5]
    tdmpc2 = EpisodeBuffer(capacity=12, obs_dim=2, action_dim=1)
    for n in range(4):  # 4 episodes of 2 transitions (3 rows each): the first is overwritten by the fourth
        tdmpc2.add_episode(torch.full((3, 2), float(n)), torch.zeros(2, 1), torch.full((2,), float(n)), torch.zeros(2))
    episodes = EpisodeBuffer.episodes_of(tdmpc2.state_dict())
    assert [int(e[2][0]) for e in episodes] == [0, 1, 2, 3][-len(episodes) :] and len(episodes) == 4
    copy = EpisodeBuffer(capacity=12, obs_dim=2, action_dim=1)
    copy.extend(episodes)
    assert [int(e[2][0]) for e in EpisodeBuffer.episodes_of(copy.state_dict())] == [int(e[2][0]) for e in episodes]


def _save_shards(directory: Path, shards: list[EpisodeReplay], step: int) -> dict:
    for rank, replay in enumerate(shards):
        path = buffer_path(directory, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"step": step, "buffer": replay.state_dict()}, path)
    return {"world_size": len(shards), "step": step}


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_saved_replays_are_dealt_out_over_another_number_of_ranks_each_episode_once(tmp_path, world_size):
    shards = [_qmix_replay(8), _qmix_replay(8)]
    shards[0].add(_qmix_episodes(0, 8))
    shards[1].add(_qmix_episodes(100, 6))
    ckpt = _save_shards(tmp_path, shards, step=500)
    dealt = []
    for rank in range(world_size):
        replay = _qmix_replay(16 // world_size + 1)
        assert restore_buffer(replay, tmp_path, ckpt, rank, world_size)
        dealt.append([int(e["reward"][0]) for e in EpisodeReplay.episodes_of(replay.state_dict())])
    assert sorted(n for share in dealt for n in share) == [*range(8), *range(100, 106)]
    assert max(map(len, dealt)) - min(map(len, dealt)) <= 1  # an even share each
    for share in dealt:  # each rank's share oldest first within each saved rank's episodes
        assert [n for n in share if n < 100] == sorted(n for n in share if n < 100)
        assert [n for n in share if n >= 100] == sorted(n for n in share if n >= 100)
    one = _qmix_replay(4)  # less room than its share: the newest of both saved ranks stay
    assert restore_buffer(one, tmp_path, ckpt, 0, 1)
    kept = [int(e["reward"][0]) for e in EpisodeReplay.episodes_of(one.state_dict())]
    assert len(kept) == 4 and {7, 105} <= set(kept) and not {0, 1, 100, 101} & set(kept)


def test_a_missing_or_stale_shard_restores_nothing(tmp_path):
    shards = [_qmix_replay(8), _qmix_replay(8)]
    for shard in shards:
        shard.add(_qmix_episodes(0, 2))
    ckpt = _save_shards(tmp_path, shards, step=500)
    assert not restore_buffer(_qmix_replay(8), tmp_path, {**ckpt, "step": 600}, 0, 1)  # saved at another step
    buffer_path(tmp_path, 1).unlink()
    assert not restore_buffer(_qmix_replay(8), tmp_path, ckpt, 0, 1)
    assert restore_buffer(_qmix_replay(8), tmp_path, ckpt, 0, 2)  # its own file, on as many ranks


def test_the_global_batch_is_kept_unless_another_is_given():
    cfg = load_config(["batch_size=64", "world_size=4"])
    saved = {"batch_size": 64, "sync_freq": 1}
    scaled, line = same_global_batch(cfg, saved, 2)
    assert scaled.batch_size == 32 and "batch_size=64 -> 32 per rank, the same 128 samples" in line
    assert same_global_batch(load_config(["batch_size=64", "world_size=1"]), saved, 2)[0].batch_size == 128
    kept, line = same_global_batch(load_config(["batch_size=64", "world_size=3", "num_envs=6"]), saved, 2)
    assert kept.batch_size == 64 and "128 samples an optimizer step become 192" in line
    chosen = load_config(["batch_size=50", "world_size=4"])  # another batch_size than the checkpoint's: as given
    assert same_global_batch(chosen, saved, 2) == (chosen, None)
    assert same_global_batch(load_config(["batch_size=64", "world_size=2"]), saved, 2)[1] is None


def test_a_checkpoints_num_envs_is_fitted_to_a_world_size_it_does_not_split_over():
    first = load_config(["task=CartPole-v1"])  # this job's keys before the checkpoint's, world_size left out
    fitted, line = envs_for_world({"num_envs": 8}, first, "3")
    assert fitted["num_envs"] == 9 and "num_envs=8 of the checkpoint does not split over 3 ranks: num_envs=9" in line
    assert envs_for_world({"num_envs": 8}, first, "4") == ({"num_envs": 8}, None)
    assert envs_for_world({"num_envs": 2}, first, "5")[0]["num_envs"] == 5  # at least one a rank
    given = load_config(["task=CartPole-v1", "num_envs=6"])  # the user's own: the usual check decides
    assert envs_for_world({"num_envs": 8}, given, "3") == ({"num_envs": 8}, None)
