"""Every seed of a job, derived in one place from (seed, global rank, purpose, step).

A fresh run uses the classic formulas (docs/distributed.md, invariant 3: env ``i`` of rank
``r`` is seeded ``seed + r * 10_000 + i``); evaluation envs a hash of (seed, rank). A resumed run
that cannot restore a generator's saved state (the environment gives none, or the world size
changed) reseeds it from the global step it resumes at: never the start-of-run seeds, so no
episode of the interrupted run is replayed.

>>> s = Seeds(seed=1, rank=3)
>>> s.env(), s.torch(), s.shared()
(30001, 4, 778)
>>> s.env(step=4096) != s.env()
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RANK_STRIDE = 10_000  # env seeds of two ranks never overlap below this many envs per rank
EVAL_OFFSET = 1_000_000  # sampled eval actions never replay a training stream's seed
SHARED_OFFSET = 777  # the generator all ranks share (identical draws on every rank)
EVAL_ACTION_STRIDE = 7919  # a prime: per-rank eval-action streams stay apart for any step
# Derived seeds (resume, evaluation envs) lie in [2^30, 2^31): apart from the fresh-run seeds, valid for every
# simulator (dm_control wants a uint32, Gymnasium any int).
_DERIVED_BASE, _DERIVED_RANGE = 2**30, 2**30

_PURPOSES = {"env": 1, "torch": 2, "shared": 3, "eval": 4}


def derive_seed(seed: int, rank: int, purpose: str, step: int) -> int:
    """A seed for ``purpose`` at global ``step`` of rank ``rank``: a hash, stable across runs."""
    words = [seed % 2**32, rank, _PURPOSES[purpose], step % 2**32, step // 2**32]
    return _DERIVED_BASE + int(np.random.SeedSequence(words).generate_state(1)[0]) % _DERIVED_RANGE


def env_seed(seed: int, global_rank: int) -> int:
    """First env seed of a rank in a fresh run: ``seed + global_rank * 10_000`` (env i adds i).

    The *global* rank, never LOCAL_RANK, so two nodes never duplicate experience.

    >>> env_seed(1, 0), env_seed(1, 3)
    (1, 30001)
    """
    return seed + global_rank * RANK_STRIDE


@dataclass(frozen=True)
class Seeds:
    """The seeds of one rank. ``step`` > 0 means "resuming at this global step"."""

    seed: int
    rank: int

    def env(self, step: int = 0) -> int:
        """First seed of this rank's training envs (env ``i`` gets this + i)."""
        return env_seed(self.seed, self.rank) if step == 0 else derive_seed(self.seed, self.rank, "env", step)

    def torch(self, step: int = 0) -> int:
        """This rank's own torch stream: action sampling, exploration, minibatch order."""
        return self.seed + self.rank if step == 0 else derive_seed(self.seed, self.rank, "torch", step)

    def shared(self, step: int = 0) -> int:
        """A stream every rank draws alike (same seed on all ranks): e.g. TD-MPC2's Q-member pairs."""
        return self.seed + SHARED_OFFSET if step == 0 else derive_seed(self.seed, 0, "shared", step)

    def eval_env(self) -> int:
        """First seed of this rank's evaluation envs (env ``i`` adds i): the same episodes at every
        evaluation of a run, none of another seed's. A hash, because ``seed + offset + i`` gave runs
        of consecutive seeds the same episodes one env apart (seed 2's env 0 was seed 1's env 1),
        so the seeds of a results row were scored on largely the same episodes."""
        return derive_seed(self.seed, self.rank, "eval", 0)

    def eval_actions(self, step: int = 0) -> int:
        """Sampled eval actions (a generator of their own, so evaluating never moves training's)."""
        return self.seed + EVAL_OFFSET + EVAL_ACTION_STRIDE * self.rank + step
