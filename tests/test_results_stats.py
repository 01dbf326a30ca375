"""The results page's statistics against rliable (Agarwal et al. 2021): the numbers below were computed with
rliable 1.2.0 (``rliable.library.get_interval_estimates`` after ``np.random.seed(3)``, 5,000 replicates,
``metrics.aggregate_iqm`` / ``aggregate_mean``) on the matrix ``SCORES``; rliable is not installed here."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from benchmarks.results import stats

SCORES = np.array(
    [[0.69, 0.12, 310.0], [0.66, 0.35, 290.5], [0.75, 0.20, 402.0], [0.40, 0.31, 288.0], [0.81, 0.05, 350.0]]
)


@pytest.mark.parametrize(
    "statistic, point, interval",
    [
        (stats.iqm, 64.7188888888889, (64.38555555555556, 73.76777777777778)),
        (stats.mean, 109.656, (98.08066666666666, 123.22073333333334)),
    ],
)
def test_point_and_interval_equal_rliables(statistic, point, interval):
    assert statistic(SCORES) == pytest.approx(point, rel=1e-12)
    assert stats.bootstrap_interval(SCORES, statistic, reps=5000, seed=3) == pytest.approx(interval, rel=1e-12)


def test_one_task_is_a_column_and_a_1d_array_is_one_task():
    column = SCORES[:3, :1]
    assert stats.bootstrap_interval(column, reps=5000, seed=3) == pytest.approx((0.66, 0.75))
    assert stats.bootstrap_interval(column.ravel(), reps=5000, seed=3) == stats.bootstrap_interval(
        column, reps=5000, seed=3
    )


@pytest.mark.parametrize("n", [3, 4, 5, 8, 10, 13])
def test_iqm_is_scipys_quarter_trimmed_mean(n):
    values = np.random.default_rng(n).normal(size=(n, 2))
    assert stats.iqm(values) == pytest.approx(scipy.stats.trim_mean(values, 0.25, axis=None), rel=1e-12)
    assert stats.iqm(np.array([0.0, 1.0, 2.0, 100.0])) == 1.5  # the outer quarters dropped


def test_verdict_by_overlap():
    assert stats.verdict((0.5, 0.6), (0.2, 0.4)) == "above"
    assert stats.verdict((0.1, 0.19), (0.2, 0.4)) == "below"
    assert stats.verdict((0.1, 0.2), (0.2, 0.4)) == "within"  # touching intervals overlap
    assert stats.verdict((0.0, 1.0), (0.2, 0.4)) == "within"


def test_the_probability_of_improvement_counts_pairs_per_task_and_averages_the_tasks():
    # task 1: ours 3, 5 against theirs 4, 4 -> pairs (3<4, 3<4, 5>4, 5>4) = 0.5; task 2: 2 against 2, 1, 3 -> ties
    # count half: (0.5 + 1 + 0) / 3 = 0.5; ddprl runs may differ in number from the peer's
    assert stats.improvement([[3, 5], [2]], [[4, 4], [2, 1, 3]]) == pytest.approx(0.5)
    assert stats.improvement([[10, 11, 12]], [[1, 2]]) == 1.0 and stats.improvement([[1]], [[2, 3]]) == 0.0
    low, high = stats.improvement_interval([[10, 11, 12]], [[1, 2]], reps=200)
    assert low == high == 1.0  # every redraw keeps every pair ordered
    low, high = stats.improvement_interval([[1.0, 2.0, 3.0, 4.0]], [[2.5, 2.6, 2.4]], reps=500)
    assert low < stats.improvement([[1.0, 2.0, 3.0, 4.0]], [[2.5, 2.6, 2.4]]) == 0.5 < high


def test_the_performance_profile_and_its_band_equal_rliables():
    """rliable 1.2.0: ``create_performance_profile({"a": SCORES / [1, 1, 1000]}, TAUS, reps=2000)`` after
    ``np.random.seed(3)`` (the run-score distribution, percentile intervals)."""
    scores, taus = SCORES / [1.0, 1.0, 1000.0], np.array([0.0, 0.1, 0.2, 0.3, 0.35, 0.5, 0.7, 0.8])
    profile = stats.score_distribution(scores, taus)
    assert profile * 15 == pytest.approx([15, 14, 12, 10, 6, 4, 2, 1])  # of the 15 runs, how many score above
    low, high = stats.profile_band(scores, taus, reps=2000, seed=3)
    assert low * 15 == pytest.approx([15, 12, 10, 7, 5, 2, 0, 0])
    assert high * 15 == pytest.approx([15, 15, 14, 13, 8, 5, 4, 3])


def test_tasks_pool_over_the_seeds_every_task_has():
    matrix = stats.first_seeds([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
    assert matrix.tolist() == [[1.0, 6.0], [2.0, 7.0], [3.0, 8.0]]  # runs x tasks, each task's first 3
