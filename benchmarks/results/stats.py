"""Aggregate scores with 95 % stratified-bootstrap confidence intervals (Agarwal et al. 2021, "Deep RL at the
Edge of the Statistical Precipice"), as the ``rliable`` package computes them, written once here so that the
results page needs neither rliable nor its dependencies (arch, pandas).

Scores are a matrix of runs x tasks (one task: a column). A bootstrap replicate draws, for every cell, a run of
that cell's task with replacement (rliable's ``StratifiedBootstrap``: runs are resampled within each task, tasks
kept), and the interval is the percentile interval of the statistic over the replicates. The draws come from
``numpy.random.RandomState(seed)`` in rliable's order, so a seed gives rliable's interval to rounding
(tests/test_results_stats.py holds numbers computed with rliable 1.2.0).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

REPS = 50_000  # rliable's default number of replicates
CONFIDENCE = 0.95
SEED = 0


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of every score (runs x tasks flattened): the mean of the middle half, with the
    same trimming as ``scipy.stats.trim_mean(scores, 0.25, axis=None)``."""
    values = np.sort(np.asarray(scores, np.float64).ravel())
    cut = int(0.25 * values.size)
    return float(values[cut : values.size - cut].mean())


def mean(scores: np.ndarray) -> float:
    return float(np.mean(scores))


def bootstrap_interval(
    scores: np.ndarray,
    statistic: Callable[[np.ndarray], float] = iqm,
    reps: int = REPS,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> tuple[float, float]:
    """The ``confidence`` percentile interval of ``statistic`` over ``reps`` stratified bootstrap replicates of
    ``scores`` (runs x tasks; a 1-D array is one task's runs)."""
    scores = np.asarray(scores, np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    runs, tasks = scores.shape
    samples = scores[replicate_runs(runs, tasks, reps, seed), np.arange(tasks)]  # reps x runs x tasks
    if statistic is iqm:  # all replicates at once: a page computes dozens of intervals
        ordered = np.sort(samples.reshape(reps, -1), axis=1)
        cut = int(0.25 * ordered.shape[1])
        replicates = ordered[:, cut : ordered.shape[1] - cut].mean(axis=1)
    else:
        replicates = np.array([statistic(sample) for sample in samples])
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


@functools.lru_cache(maxsize=16)
def replicate_runs(runs: int, tasks: int, reps: int, seed: int) -> np.ndarray:
    """Each replicate's run for every cell (reps x runs x tasks), drawn as rliable draws them, one replicate at a
    time; they depend only on the shape and the seed, so every row of a page with as many seeds shares them."""
    rng = np.random.RandomState(seed)
    drawn = np.stack([rng.choice(runs, (runs, tasks), replace=True) for _ in range(reps)])
    drawn.flags.writeable = False
    return drawn


def first_seeds(tasks: list[list[float]]) -> np.ndarray:
    """Each task's runs as a column of one runs x tasks matrix, cut to the fewest any task has (its first ones),
    so that every task weighs alike in a statistic over all runs, as rliable's matrices make them."""
    runs = min(len(task) for task in tasks)
    return np.asarray([task[:runs] for task in tasks], np.float64).T


def score_distribution(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """The performance profile (rliable's ``run_score_distribution``): for each threshold of ``taus``, the share
    of all runs of every task (runs x tasks) that score above it."""
    flat = np.asarray(scores, np.float64).ravel()
    return (flat[None, :] > np.asarray(taus, np.float64)[:, None]).mean(axis=1)


def profile_band(
    scores: np.ndarray, taus: np.ndarray, reps: int = 2_000, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray]:
    """The 95 % percentile band of :func:`score_distribution` at every threshold over ``reps`` stratified
    bootstrap replicates of ``scores`` (runs x tasks): the draws of :func:`bootstrap_interval`, as rliable's
    ``create_performance_profile`` makes them for one algorithm."""
    scores = np.asarray(scores, np.float64)
    runs, tasks = scores.shape
    samples = scores[replicate_runs(runs, tasks, reps, seed), np.arange(tasks)]  # reps x runs x tasks
    taus = np.asarray(taus, np.float64)
    replicates = (samples[:, None] > taus[None, :, None, None]).mean(axis=(2, 3))  # reps x taus
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return low, high


def verdict(ours: tuple[float, float], reference: tuple[float, float]) -> str:
    """``above`` / ``below`` when the two intervals do not overlap, else ``within``."""
    if ours[0] > reference[1]:
        return "above"
    if ours[1] < reference[0]:
        return "below"
    return "within"


def improvement(ours: list[list[float]], theirs: list[list[float]]) -> float:
    """The probability of improvement (rliable's ``probability_of_improvement``): for each task the chance that a
    run of ours scores above a run of theirs, ties counting half (the Mann-Whitney U over the pairs), averaged
    over tasks. Each task's runs are a list; the two sides may hold different numbers of runs."""
    chances = []
    for x, y in zip(ours, theirs, strict=True):
        x, y = np.asarray(x, np.float64)[:, None], np.asarray(y, np.float64)[None, :]
        chances.append(float(np.mean((x > y) + 0.5 * (x == y))))
    return float(np.mean(chances))


def improvement_interval(
    ours: list[list[float]], theirs: list[list[float]], reps: int = 2_000, seed: int = SEED
) -> tuple[float, float]:
    """The 95 % percentile interval of :func:`improvement` over replicates that redraw each task's runs of each
    side with replacement, independently (rliable's ``StratifiedIndependentBootstrap``)."""
    rng = np.random.RandomState(seed)
    replicates = np.empty(reps)
    for i in range(reps):
        redraw = lambda runs: [np.asarray(r)[rng.randint(0, len(r), len(r))] for r in runs]  # noqa: E731
        replicates[i] = improvement(redraw(ours), redraw(theirs))
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)
