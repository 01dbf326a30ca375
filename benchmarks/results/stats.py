"""Numbers from a run's curve, and the page's comparisons of them."""

from __future__ import annotations

import statistics

from .rows import EVAL


def curve(rows: list[dict], key: str = EVAL) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def at_steps(points: list[tuple[int, float]], steps: int) -> float | None:
    """The last value at or before ``steps`` (a budget rounds up to whole iterations: 2.5 % past counts)."""
    done = [value for step, value in points if step <= steps * 1.025]
    return done[-1] if done else None


def window_mean(points: list[tuple[int, float]], steps: int) -> float | None:
    """The mean over the last 5 % of ``steps`` (one iteration's training return is too noisy alone)."""
    window = [value for step, value in points if steps * 0.95 < step <= steps * 1.025]
    return statistics.mean(window) if window else None


def mean_std(values: list[float], digits: int) -> str:
    if len(values) < 2:
        return f"{values[0]:.{digits}f} (1 seed)" if values else "not run"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def gap(values: list[float], value: float, std: float | None) -> str:
    """(mean of ``values`` - ``value``) in units of ``std``, the reference's ±."""
    diff = statistics.mean(values) - value if values and std is not None else None
    if diff is None or std == 0:
        return "0" if diff == 0 else "— (ref. std 0)" if std == 0 else "—"
    return f"{diff / std:+.2f}"


def welch(a: list[float], b: list[float]) -> float:
    """Welch's t-test of two means: the chance that seeds alone part them this far."""
    from scipy.stats import ttest_ind

    return float(ttest_ind(a, b, equal_var=False).pvalue)
