"""Evaluation shared by all algorithms: episodes split over ranks, results gathered on all.

Every rank takes part, also a rank with no episode to run (it still joins the gather), so no
rank waits on a collective that another skipped (docs/distributed.md, invariant 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from ddprl.envs.base import VecEnv

if TYPE_CHECKING:
    from ddprl.runtime.protocol import JobRuntime

Progress = Callable[[int, int], None]  # (episodes done, episodes) of this rank


class Actor(NamedTuple):
    """What ``ddprl eval``/``play`` need from a trained agent, whatever its algorithm."""

    make_env: Callable[[int, int], VecEnv]  # (num_envs, seed) -> env
    act: Callable[[torch.Tensor], torch.Tensor]  # observations -> deterministic actions
    extra_keys: tuple[str, ...] = ()  # env-specific episode stats to report (e.g. episode_score)


def split_episodes(episodes: int, world_size: int, rank: int) -> int:
    """Episodes this rank runs: an even split, the first ``episodes % world_size`` ranks one more."""
    return episodes // world_size + (1 if rank < episodes % world_size else 0)


def episode_record(info: dict[str, torch.Tensor], i: int, extra_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """The finished episode of env ``i`` from a step's ``info``: return, length and ``extra_keys``
    (``episode_score`` is reported as ``score``)."""
    rec = {"return": float(info["episode_return"][i]), "length": float(info["episode_length"][i])}
    for key in extra_keys:
        rec[key.removeprefix("episode_")] = float(info[key][i])
    return rec


@torch.no_grad()
def run_episodes(
    env: VecEnv,
    act: Callable[[torch.Tensor], torch.Tensor],
    episodes: int,
    seed: int,
    extra_keys: tuple[str, ...] = (),
    progress: Progress | None = None,
) -> list[dict[str, float]]:
    """Run exactly ``episodes`` episodes on ``env`` and return one record per episode.

    Each env of the batch gets a fixed quota of episodes decided up front. Counting "the first
    k episodes to finish" instead would favour short episodes and bias the mean.
    ``progress(done, episodes)`` is called at the start and after every finished episode.
    """
    n = env.num_envs
    quota = torch.tensor([episodes // n + (1 if i < episodes % n else 0) for i in range(n)])
    done_count = torch.zeros(n, dtype=torch.long)
    records: list[dict[str, float]] = []
    obs = env.reset(seed=seed)
    if progress is not None:
        progress(0, episodes)
    while bool((done_count < quota).any()):
        obs, _, terminated, truncated, info = env.step(act(obs))
        finished = (terminated | truncated).cpu()
        for i in torch.nonzero(finished).flatten().tolist():
            if done_count[i] < quota[i]:
                records.append(episode_record(info, i, extra_keys))
                done_count[i] += 1
                if progress is not None:
                    progress(len(records), episodes)
    return records


def summarize(records: list[dict[str, float]]) -> dict[str, float]:
    """``return_mean``, ``return_std`` (population), ``return_min``, ``return_max``,
    ``length_mean``, ... and ``episodes``.

    The worst and best episode go with the return: a mean of 730 ± 420 over 4 episodes is
    three near 975 and one near 0 (an episode the policy failed outright), which only they show.
    """
    if not records:
        return {"episodes": 0}
    out: dict[str, float] = {"episodes": float(len(records))}
    for key in records[0]:
        values = [r[key] for r in records]
        mean = sum(values) / len(values)
        out[f"{key}_mean"] = mean
        out[f"{key}_std"] = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        if key == "return":
            out["return_min"], out["return_max"] = min(values), max(values)
    return out


def evaluate(
    rt: JobRuntime,
    make_eval_env: Callable[[int, int], VecEnv],
    act: Callable[[torch.Tensor], torch.Tensor],
    episodes: int,
    seed: int,
    extra_keys: tuple[str, ...] = (),
    progress: Progress | None = None,
) -> dict[str, float]:
    """Collective: run ``episodes`` episodes over all ranks; every rank gets the global summary.

    ``make_eval_env(num_envs, seed)`` builds this rank's eval env; ``act(obs)`` picks actions;
    ``progress`` hears of this rank's episodes as they finish (``Run.eval_progress`` shows them).
    """
    local = split_episodes(episodes, rt.world_size, rt.rank)
    records: list[dict[str, float]] = []
    if local > 0:
        rank_seed = rt.seeds(seed).eval_env()  # never a training env's seed
        env = make_eval_env(min(local, 8), rank_seed)
        try:
            records = run_episodes(env, act, local, rank_seed, extra_keys, progress)
        finally:
            env.close()
    gathered = rt.all_gather_object(records)
    return summarize([r for rank_records in gathered for r in rank_records])
