"""The results page's per-suite figures: the common step grid, the IQM over seeds and its bootstrap band, and a
figure drawn twice giving the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.results import figures, stats
from benchmarks.results.figures import Panel, Series


def line(slope: float, steps) -> list[tuple[int, float]]:
    return [(int(s), slope * s) for s in steps]


def test_straight_lines_give_their_iqm_on_the_shortest_seeds_span():
    """Four seeds on different step grids (under ``BINS`` points each: not binned), slopes 1, 2, 3 and 10: the
    IQM drops the outer two (2.5 x step, the mean would be 4 x step), the grid runs from the latest first step to
    the earliest last one."""
    seeds = [
        line(1, range(0, 581, 20)),  # ends at 580: the shortest
        line(2, range(5, 900, 20)),
        line(3, range(3, 1000, 25)),
        line(10, range(8, 1200, 30)),
    ]
    agg = figures.aggregate(seeds, points=40, reps=500)
    assert agg.steps[0] == 8 and agg.steps[-1] == 580 and agg.steps.size == 40
    np.testing.assert_allclose(agg.iqm, 2.5 * agg.steps, rtol=1e-12)
    assert np.all(agg.low <= agg.iqm + 1e-9) and np.all(agg.iqm <= agg.high + 1e-9)
    assert np.all(agg.high > agg.low)  # four different seeds: a band of some width


def test_three_lines_give_their_mean_and_one_seed_no_band():
    seeds = [line(a, range(0, 101, 5)) for a in (1.0, 2.0, 6.0)]
    agg = figures.aggregate(seeds, points=11, reps=200)
    np.testing.assert_allclose(agg.iqm, 3.0 * np.linspace(0, 100, 11), rtol=1e-12)  # 3 seeds: no trimming
    one = figures.aggregate(seeds[:1], points=11)
    np.testing.assert_allclose(one.iqm, np.linspace(0, 100, 11))
    assert one.low is None and one.high is None


def test_the_grid_never_extrapolates():
    """Values are interpolated only between each seed's own points: the grid stops at the earliest last step even
    where a seed's curve would go on rising."""
    grid, values = figures.on_grid([[(0, 0.0), (100, 100.0)], [(20, 5.0), (60, 9.0)]], points=5)
    np.testing.assert_allclose(grid, [20, 30, 40, 50, 60])
    np.testing.assert_allclose(values, [[20, 30, 40, 50, 60], [5, 6, 7, 8, 9]])
    grid, values = figures.on_grid([[(0, 0.0), (10, 1.0)], [(20, 5.0), (60, 9.0)]])  # no overlap: nothing
    assert grid.size == 0 and values.shape == (2, 0)


def test_a_dense_noisy_curve_is_averaged_in_bins():
    """A training-return-like curve (2,000 noisy points about 0.01 x step): its bins' means lie on the line,
    at each bin's mean step, and a straight dense line stays exactly on itself."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 2001) * 500
    noisy = list(zip(steps.tolist(), (0.01 * steps + rng.normal(0, 50, steps.size)).tolist(), strict=True))
    points = figures.binned(noisy, steps[-1], bins=50)
    assert len(points) == 50
    s, v = np.asarray(points).T
    np.testing.assert_allclose(s, 500 * (np.arange(50) * 40 + 20.5))  # 40 points a bin
    assert np.abs(v - 0.01 * s).max() < 50 * 4 / np.sqrt(40)  # within 4 standard errors of the bin mean
    grid, values = figures.on_grid([noisy], points=30)
    assert grid[0] == s[0] and grid[-1] == s[-1]
    assert np.abs(values[0] - 0.01 * grid).max() < 50 * 4 / np.sqrt(40)
    straight = figures.binned(line(3.0, steps), steps[-1], bins=50)
    np.testing.assert_allclose([v for _, v in straight], [3.0 * s for s, _ in straight], rtol=1e-12)


def test_the_band_is_stats_bootstrap_interval_at_each_step():
    rng = np.random.default_rng(1)
    values = rng.normal(size=(5, 7)) * 10
    low, high = figures.bootstrap_band(values, reps=300, seed=4)
    for j in range(7):
        assert (low[j], high[j]) == pytest.approx(stats.bootstrap_interval(values[:, j], reps=300, seed=4), rel=1e-12)


def test_layout_and_legend_columns():
    assert [figures.layout(n) for n in (1, 3, 4, 5, 6, 8, 9, 13)] == [
        (1, 1),
        (1, 3),
        (1, 4),
        (2, 3),
        (2, 3),
        (2, 4),
        (3, 3),
        (4, 4),
    ]
    assert figures.legend_columns(["ddprl", "CleanRL run here"], 9.6) == 2
    assert figures.legend_columns(["a" * 60] * 3, 6.4) == 1


def suite() -> list[Panel]:
    rng = np.random.default_rng(2)
    dense = [
        [(int(s), float(0.002 * s + rng.normal(0, 30))) for s in np.cumsum(rng.integers(1500, 2500, n))]
        for n in (480, 500, 470)
    ]
    evals = [line(a, range(0, 200_001 + 10_000 * k, 10_000)) for k, a in enumerate((1e-3, 2e-3, 1.5e-3))]
    return [
        Panel(
            "Hopper-v5",
            "training episode return",
            [Series("ddprl", "C0", dense), Series("CleanRL run here", "C1", dense[:1])],
            (900.0, 60.0),
            "CleanRL pr-424",
        ),
        Panel("CartPole-v1", "episode return (greedy eval)", [Series("ddprl", "C0", evals)], (300.0, None), "SB3 zoo"),
        Panel("smax/3m", "win rate", [Series("ddprl", "C0", [line(4e-6, range(0, 200_001, 50_000))])]),
    ]


def test_a_suite_draws_the_same_png_twice(tmp_path):
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    figures.draw_suite(first, "A suite", suite())
    figures.draw_suite(second, "A suite", suite())
    data = first.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data == second.read_bytes()
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(str(first)).shape
    assert width == round(3 * figures.PANEL[0] * figures.DPI)  # three panels side by side
    assert b"Software" not in data
