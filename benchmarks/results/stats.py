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
    rng = np.random.RandomState(seed)
    columns = np.arange(tasks)[None, :]
    replicates = np.empty(reps)
    for i in range(reps):
        replicates[i] = statistic(scores[rng.choice(runs, (runs, tasks), replace=True), columns])
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def verdict(ours: tuple[float, float], reference: tuple[float, float]) -> str:
    """``above`` / ``below`` when the two intervals do not overlap, else ``within``."""
    if ours[0] > reference[1]:
        return "above"
    if ours[1] < reference[0]:
        return "below"
    return "within"
