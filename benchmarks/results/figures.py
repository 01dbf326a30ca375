"""One figure per suite of the results page, drawn as Agarwal et al. 2021 ("Deep RL at the Edge of the Statistical
Precipice", rliable) recommend for sample-efficiency curves: for each implementation on each task, the interquartile
mean over seeds at each point of a common step grid, with its 95 % stratified-bootstrap interval shaded.

Each seed's curve is put on the grid first: a dense one (more than ``BINS`` points: training episode returns) is
averaged in ``BINS`` bins of steps, each bin's mean placed at its points' mean step, so that the line is not one
iteration's noise; then it is interpolated linearly at ``POINTS`` steps from the latest first step to the earliest
last step of the implementation's seeds, never extrapolated. The band is ``stats.bootstrap_interval`` at each grid
step (the same draws, as one array), with ``REPS`` replicates rather than the tables' 50,000 so that a figure takes
seconds. The PNG holds no date nor version: the same curves give the same bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import stats

POINTS = 100  # grid steps per implementation's curve
BINS = 50  # a seed with more points than this is averaged in this many bins of steps first
REPS = 2_000  # bootstrap replicates at each grid step (the tables: stats.REPS)
COLUMNS = 4  # panels per figure row at most
PANEL = (3.2, 2.6)  # inches per panel
DPI = 100
REFERENCE_STYLES = ("--", ":", "-.")  # one per distinct reference label of a figure, in order of appearance

Curve = Sequence[tuple[int, float]]  # one seed's (step, value) points, steps increasing


@dataclass(frozen=True)
class Series:
    """One implementation's seeds on one task."""

    label: str  # legend text, e.g. "ddprl", "CleanRL run here", "PureJaxRL"
    colour: str  # a matplotlib colour
    seeds: Sequence[Curve]


@dataclass(frozen=True)
class Panel:
    task: str  # the panel's title
    ylabel: str  # e.g. "episode return (greedy eval)", "win rate", "training episode return"
    series: Sequence[Series] = field(default_factory=tuple)
    reference: tuple[float, float | None] | None = None  # a published value and its ± (None: no ± known)
    reference_label: str = "published reference"  # its legend text
    xlabel: str = "environment steps (millions)"
    xunit: float = 1e6  # steps per x unit


@dataclass(frozen=True)
class Aggregate:
    """An implementation's curve across its seeds: the IQM at each grid step and its interval (one seed: that
    seed's values, no interval)."""

    steps: np.ndarray
    iqm: np.ndarray
    low: np.ndarray | None
    high: np.ndarray | None


@dataclass(frozen=True)
class Profile:
    """An implementation's performance profile over a suite's tasks: at each threshold of a common scale, the
    share of its runs scoring above it (``stats.score_distribution``) and that share's 95 % interval."""

    label: str
    colour: str
    taus: np.ndarray
    share: np.ndarray
    low: np.ndarray
    high: np.ndarray


def binned(points: Curve, end: float, bins: int = BINS) -> list[tuple[float, float]]:
    """The mean of the points in each of ``bins`` equal bins of (0, ``end``], at the mean step of its points
    (a straight line stays on itself); points past ``end`` are left out, empty bins give no point."""
    steps, values = np.asarray([s for s, _ in points], np.float64), np.asarray([v for _, v in points], np.float64)
    keep = steps <= end
    steps, values = steps[keep], values[keep]
    which = np.clip(np.ceil(steps * bins / end).astype(int) - 1, 0, bins - 1)  # an edge step: the bin it ends
    count = np.bincount(which, minlength=bins)
    full = count > 0
    mean_step = np.bincount(which, steps, bins)[full] / count[full]
    mean_value = np.bincount(which, values, bins)[full] / count[full]
    return list(zip(mean_step.tolist(), mean_value.tolist(), strict=True))


def on_grid(seeds: Sequence[Curve], points: int = POINTS, bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """The common grid (``points`` steps from the latest first step to the earliest last step; empty when the
    seeds do not overlap) and each seed's values there (seeds x steps), dense seeds binned first."""
    seeds = [list(s) for s in seeds if len(s)]
    if not seeds:
        return np.empty(0), np.empty((0, 0))
    end = min(s[-1][0] for s in seeds)
    curves = [binned(s, end, bins) if len(s) > bins else s for s in seeds]
    first, last = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    if first > last:
        return np.empty(0), np.empty((len(curves), 0))
    grid = np.linspace(first, last, points) if last > first else np.asarray([float(first)])
    values = np.stack([np.interp(grid, [s for s, _ in c], [v for _, v in c]) for c in curves])
    return grid, values


def bootstrap_band(values: np.ndarray, reps: int = REPS, seed: int = stats.SEED) -> tuple[np.ndarray, np.ndarray]:
    """``stats.bootstrap_interval(values[:, j], stats.iqm, reps, seed=seed)`` for every column j at once: the same
    resampled seeds (one draw of ``reps`` x seeds from ``RandomState(seed)``) applied to every grid step."""
    runs = values.shape[0]
    draws = stats.replicate_runs(runs, 1, reps, seed)[:, :, 0]  # the draws of one task's interval
    cut = int(0.25 * runs)
    replicates = np.sort(values[draws], axis=1)[:, cut : runs - cut].mean(axis=1)  # reps x steps
    tail = 100 * (1 - stats.CONFIDENCE) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return low, high


def aggregate(seeds: Sequence[Curve], points: int = POINTS, reps: int = REPS, bins: int = BINS) -> Aggregate:
    """The IQM over seeds (``stats.iqm``) at each grid step and its 95 % stratified-bootstrap interval."""
    grid, values = on_grid(seeds, points, bins)
    if len(values) == 1 or not grid.size:
        return Aggregate(grid, values[0] if len(values) else grid, None, None)
    iqm = np.asarray([stats.iqm(values[:, j]) for j in range(grid.size)])
    low, high = bootstrap_band(values, reps)
    return Aggregate(grid, iqm, low, high)


def layout(n: int, columns: int = COLUMNS) -> tuple[int, int]:
    """(rows, columns) for ``n`` panels: at most ``columns`` a row, the rows as even as they go."""
    rows = -(-n // columns)
    return rows, -(-n // rows)


def legend_columns(labels: Sequence[str], width: float) -> int:
    """The most legend columns (filled column by column) whose entries fit side by side in ``width`` inches, an
    entry ~0.07 inch a character at 9 points after 0.7 inch of line and padding."""
    entries = [0.7 + 0.07 * len(label) for label in labels]
    for ncols in range(len(labels), 1, -1):
        rows = -(-len(labels) // ncols)
        if sum(max(entries[i : i + rows]) for i in range(0, len(labels), rows)) <= width:
            return ncols
    return 1


def draw_profiles(path: Path, title: str, panels: Sequence[tuple[str, str, Sequence[Profile]]]) -> None:
    """One figure into ``path`` (PNG) with a panel per (title, x label, profiles): each profile's share of runs
    above each threshold as a line, its interval shaded, and a legend of the panel's own (lower left, where a
    profile, falling from the top left, leaves room)."""
    from matplotlib.figure import Figure

    rows, cols = layout(len(panels))
    fig = Figure(figsize=(cols * PANEL[0], rows * PANEL[1] + 0.4), dpi=DPI, layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False)
    for i, (task, xlabel, profiles) in enumerate(panels):
        ax = grid[divmod(i, cols)]
        for profile in profiles:
            ax.plot(profile.taus, profile.share, color=profile.colour, linewidth=1.4, label=profile.label)
            ax.fill_between(profile.taus, profile.low, profile.high, color=profile.colour, alpha=0.2, linewidth=0)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.25, linewidth=0.5)
        ax.legend(loc="lower left", fontsize=7, frameon=False)
        if i % cols == 0:
            ax.set_ylabel("share of runs scoring above", fontsize=9)
    for ax in grid.ravel()[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    fig.savefig(path, format="png", metadata={"Software": None})


def draw_suite(path: Path, title: str, panels: Sequence[Panel], columns: int = COLUMNS) -> None:
    """One figure of ``panels`` under ``title`` into ``path`` (PNG): in each, every series' IQM over its seeds
    with the interval shaded and the reference dashed with its ± shaded; one legend for the figure. An axis label
    shared by a whole figure row (y) or column (x) is written once there."""
    from matplotlib.figure import Figure  # the object API: no pyplot state, no display

    panels = list(panels)
    rows, cols = layout(len(panels), columns)
    fig = Figure(figsize=(cols * PANEL[0], rows * PANEL[1] + 0.9), dpi=DPI, layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False)
    handles: dict[str, object] = {}  # the series' legend entries, then the references'
    references: dict[str, object] = {}
    styles: dict[str, str] = {}
    for i, panel in enumerate(panels):
        r, c = divmod(i, cols)
        ax = grid[r][c]
        for series in panel.series:
            agg = aggregate(series.seeds)
            if not agg.steps.size:
                continue
            x = agg.steps / panel.xunit
            marker = "o" if x.size == 1 else None
            (line,) = ax.plot(x, agg.iqm, color=series.colour, linewidth=1.4, marker=marker)
            if agg.low is not None:
                ax.fill_between(x, agg.low, agg.high, color=series.colour, alpha=0.2, linewidth=0)
            handles.setdefault(series.label, line)
        if panel.reference is not None:
            value, spread = panel.reference
            style = styles.setdefault(panel.reference_label, REFERENCE_STYLES[len(styles) % len(REFERENCE_STYLES)])
            line = ax.axhline(value, color="k", linestyle=style, linewidth=1.0)
            if spread:
                ax.axhspan(value - spread, value + spread, color="k", alpha=0.08, linewidth=0)
            references.setdefault(panel.reference_label, line)
        ax.set_title(panel.task, fontsize=10)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.25, linewidth=0.5)
        same_row = {p.ylabel for p in panels[r * cols : (r + 1) * cols]}
        if c == 0 or len(same_row) > 1:
            ax.set_ylabel(panel.ylabel, fontsize=9)
        column = panels[c::cols]
        if len({p.xlabel for p in column}) > 1 or panel is column[-1]:
            ax.set_xlabel(panel.xlabel, fontsize=9)
    for ax in grid.ravel()[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    handles.update(references)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncols=legend_columns(list(handles), cols * PANEL[0]),
            fontsize=9,
            frameon=False,
        )
    fig.savefig(path, format="png", metadata={"Software": None})
