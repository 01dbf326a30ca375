"""Numbers from a run's curve: the value at a reference's step count, the mean over the last 5 %,
confidence intervals, and Papoudakis et al.'s maximum and average returns."""

from __future__ import annotations

import statistics

from .rows import EVAL, TRAIN, Reference


def curve(rows: list[dict], key: str = EVAL) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def at_steps(points: list[tuple[int, float]], steps: int) -> float | None:
    """The last evaluation at or before ``steps`` (a run's budget rounds up to whole iterations, so
    the final evaluation may lie a little past it: it counts when within 2.5 %)."""
    done = [ret for step, ret in points if step <= steps * 1.025]
    return done[-1] if done else None


def window_mean(points: list[tuple[int, float]], steps: int) -> float | None:
    """The mean training-episode return logged over the last 5 % of ``steps``: one iteration's
    value is the mean of the few episodes that ended in it, too noisy to stand alone."""
    window = [ret for step, ret in points if steps * 0.95 < step <= steps * 1.025]
    return statistics.mean(window) if window else None


def confidence95(values: list[float]) -> float:
    """Half the width of the 95 % confidence interval of the mean of ``values`` (Student's t)."""
    from scipy.stats import t

    return float(t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5)


def across_seeds(curves: list[list[tuple[int, float]]]) -> dict[int, list[float]]:
    """``{step: each curve's value there}`` for the evaluation steps every one of ``curves`` has, in order."""
    steps = sorted(set.intersection(*(set(dict(c)) for c in curves)))
    return {step: [dict(c)[step] for c in curves] for step in steps}


def per_agent(curves: list[list[tuple[int, float]]], agents: int) -> list[list[tuple[int, float]]]:
    """Team-return curves divided by the agents (the page's unit on MPE, as Papoudakis et al.'s)."""
    return [[(step, r / agents) for step, r in c] for c in curves]


def papoudakis_returns(curves: list[list[tuple[int, float]]]) -> dict:
    """Papoudakis et al. 2021's two measures of a row's runs (each seed's evaluation curve):
    maximum returns, the evaluation step at which the mean over seeds is highest, with the mean
    and its 95 % confidence interval there; average returns, each seed's mean over all its
    evaluations, then the mean and interval of those. Steps every seed evaluated at only."""
    at = across_seeds(curves)
    best = max(at, key=lambda step: statistics.mean(at[step]))
    averages = [statistics.mean(r for step, r in c if step in at) for c in curves]
    return {
        "max_step": best,
        "max_mean": statistics.mean(at[best]),
        "max_ci95": confidence95(at[best]),
        "average_mean": statistics.mean(averages),
        "average_ci95": confidence95(averages),
    }


def measure(rows: list[dict], ref: Reference) -> float | None:
    """ddprl's number to set beside ``ref``, measured as ``ref`` is (``rows``: a run's metrics)."""
    if ref.metric == TRAIN:
        return window_mean(curve(rows, TRAIN), ref.steps)
    return at_steps(curve(rows, ref.metric), ref.steps)


def binned_mean(records: list[dict], key: str, width: float) -> dict[int, float]:
    """``{bin: mean}`` of ``key`` over the records whose step falls in each ``width``-step bin."""
    bins: dict[int, list[float]] = {}
    for r in records:
        if key in r:
            bins.setdefault(int((r["step"] - 1) // width), []).append(r[key])
    return {b: statistics.mean(values) for b, values in bins.items()}
