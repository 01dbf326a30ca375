"""``ddprl plot``: learning curves of one or more runs, drawn from their ``metrics.jsonl``.

One subplot per metric, one line per run (the same colour in every subplot), written without a
display to PNG, PDF or SVG. Steps read 250k / 1.5M, wall time is in the unit that fits the
longest run (s, min or h), and each y axis says what it measures. matplotlib is imported inside
``figure`` so that importing ddprl for training does not pay for it.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ddprl.errors import UsageError
from ddprl.metrics import metrics_path, read_metrics

# What a glance at a run asks first: does it learn (return), how fast (fps); losses follow.
HEADLINE_KEYS = ("eval/return_mean", "train/episode_return", "time/global_fps")
X_LABELS = {"step": "global steps", "wall_time": "wall time"}
# Wall-time units: the first whose span holds the longest run (seconds up to 2 minutes, ...).
TIME_UNITS = ((120.0, 1.0, "s"), (7200.0, 60.0, "min"), (math.inf, 3600.0, "h"))
SUFFIXES = (".png", ".pdf", ".svg")
ARG_KEYS = ("out", "keys", "x")


def parse_plot_args(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``["runs/a", "runs/b", "keys=[train/loss]", "x=wall_time"]`` -> ``(run_dirs, options)``.

    ``options`` holds only the keys given (``out``, ``keys`` as a list, ``x``), ready for
    ``plot_runs(run_dirs, **options)``. An argument is ``key=value`` only when the part before
    ``=`` is a plain identifier: a path that happens to contain ``=`` stays a run directory.
    """
    run_dirs: list[str] = []
    options: dict[str, Any] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not (sep and key.isidentifier()):
            run_dirs.append(arg)
            continue
        if key not in ARG_KEYS:
            raise UsageError(f"plot: unknown key {key!r}{_did_you_mean(key, ARG_KEYS)}; keys: {', '.join(ARG_KEYS)}")
        if key == "keys":
            value = [k.strip() for k in value.strip().removeprefix("[").removesuffix("]").split(",") if k.strip()]
            if not value:
                raise UsageError("plot: keys= names no metric; e.g. keys=eval/return_mean,train/loss")
        options[key] = value
    if not run_dirs:
        raise UsageError("plot: give at least one RUN_DIR")
    return run_dirs, options


def plot_runs(
    run_dirs: list[str | Path], out: str | Path | None = None, keys: list[str] | None = None, x: str = "step"
) -> Path:
    """Draw ``keys`` (default: ``default_keys``) of every run against ``x`` into ``out``; return ``out``.

    ``out`` unset: ``curves.png`` beside the runs (:func:`default_out`)."""
    if x not in X_LABELS:
        raise UsageError(f"plot: x={x!r} is not one of {', '.join(X_LABELS)}")
    out = default_out(run_dirs) if out is None else Path(out)
    if out.suffix.lower() not in SUFFIXES:
        raise UsageError(f"plot: out={str(out)!r} must end in {', '.join(SUFFIXES)}")
    runs = load_runs(run_dirs)
    available = sorted({k for records in runs.values() for r in records for k in r} - set(X_LABELS))
    if keys is None:
        keys = default_keys(available)
        if not keys:
            raise UsageError(
                f"plot: none of the usual metrics in these runs; pick with keys=...; keys: {_brief(available)}"
            )
    for key in keys:
        if key not in available:
            raise UsageError(f"plot: no run has {key!r}{_did_you_mean(key, available)}; keys: {_brief(available)}")

    fig = figure(runs, keys, x)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def default_out(run_dirs: list[str | Path]) -> Path:
    """``curves.png`` inside the run directory, or for several runs in the directory that holds
    them all (``runs/a runs/b`` -> ``runs/curves.png``): beside the runs, not wherever the
    command was typed."""
    paths = [Path(d).resolve() for d in run_dirs]
    if len(paths) == 1:
        return Path(run_dirs[0]) / "curves.png"
    common = Path(os.path.commonpath(paths))
    return common / "curves.png"


def figure(
    runs: dict[str, list[dict[str, Any]]],
    keys: list[str],
    x: str = "step",
    styles: dict[str, dict[str, Any]] | None = None,
) -> Any:
    """The matplotlib Figure of ``keys`` of ``runs`` (``load_runs``) against ``x``; its ``axes``
    are the subplots, in the order of ``keys``. ``styles``: a run's line keywords instead of the
    defaults (``{"color": "C0", "linestyle": "--"}``: two attempts of one seed in one colour, say);
    its spread band takes the line's colour."""
    from matplotlib.figure import Figure  # a bare Figure draws with Agg: no display, no global backend switch
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    longest = max((r[x] for records in runs.values() for r in records if x in r), default=0.0)
    scale, x_label = 1.0, X_LABELS[x]
    if x == "wall_time":
        _, scale, unit = next(u for u in TIME_UNITS if longest <= u[0])
        x_label = f"wall time ({unit})"
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(4.8 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax in axes[len(keys) :]:
        fig.delaxes(ax)
    handles = {}
    for ax, key in zip(axes, keys, strict=True):
        for i, (label, records) in enumerate(runs.items()):
            style = {"color": f"C{i}", **(styles or {}).get(label, {})}
            points = sorted(
                ((r[x] / scale, r[key], r.get("eval/return_std")) for r in records if key in r and x in r),
                key=lambda p: p[0],
            )
            if not points:
                continue
            xs, ys, stds = zip(*points, strict=True)
            # Few points (evaluations, a short run) get markers: a single point draws no line.
            marker = "o" if len(xs) <= 20 else None
            (handles[label],) = ax.plot(xs, ys, label=label, marker=marker, markersize=3, **style)
            # The spread over eval episodes tells a real gain from a lucky evaluation.
            if key == "eval/return_mean" and all(s is not None for s in stds):
                ax.fill_between(
                    xs,
                    [y - s for y, s in zip(ys, stds, strict=True)],
                    [y + s for y, s in zip(ys, stds, strict=True)],
                    color=style["color"],
                    alpha=0.2,
                    linewidth=0,
                )
        ax.set_title(key, fontsize=10)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label(key))
        # At most 6 ticks with short labels: long step counts ("1250000") ran into each other.
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: compact(v)))
        ax.yaxis.set_major_formatter(FuncFormatter(functools.partial(_y_tick, ax)))
        ax.grid(alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="outside upper center", ncol=legend_columns(fig, handles))
    return fig


def legend_columns(fig: Any, labels: Collection[str]) -> int:
    """Up to 4 legend entries a row, fewer where long names would run past the figure's edges
    (a 10-point character is ~0.076 inch wide; a handle and the gaps ~0.6 inch an entry)."""
    longest = max((len(label) for label in labels), default=1)
    fits = int(fig.get_figwidth() // (0.076 * longest + 0.6))
    return max(1, min(4, len(labels), fits))


def _y_tick(ax: Any, value: float, _pos: Any) -> str:
    """Every label of an axis in one style: 8k, 10k, 12k (not 8000, 10k) once the axis reaches 10,000."""
    return compact(value) if max(abs(v) for v in ax.get_ylim()) >= 10_000 else f"{value:g}"


def compact(value: float) -> str:
    """A tick label: 0, 512, 2.5k, 100k, 1M, 1.25M, 2B (at most 3 significant digits)."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def y_label(key: str) -> str:
    """What a metric measures, for its y axis (the subplot's title names the key itself)."""
    if key == "eval/return_mean":
        return "return (mean ± std)"
    name = key.rsplit("/", 1)[-1]
    words = name.split("_")
    if "fps" in words:
        return "steps / s"
    if name.endswith("_per_s"):
        return " ".join(words[:-2]) + " / s"
    if name.endswith("_s"):
        return "seconds"
    for word, label in (
        ("return", "return"),
        ("loss", "loss"),
        ("length", "agent steps"),
        ("accuracy", "accuracy"),
        ("success", "success rate"),
        ("lr", "learning rate"),
    ):
        if word in words:
            return label
    return " ".join(words)


def default_keys(available: list[str]) -> list[str]:
    """The headline metrics present, then every ``train/*loss*`` key present (sorted)."""
    losses = sorted(k for k in available if k.startswith("train/") and "loss" in k)
    return [k for k in HEADLINE_KEYS if k in available] + losses


def load_runs(run_dirs: list[str | Path]) -> dict[str, list[dict[str, Any]]]:
    """``{label: records}`` in the given order; the label is the directory's name (its path when
    two runs share a name, e.g. ``seed0`` of two sweeps). Wall time is made cumulative over the
    segments of a resumed run written before the logger went on from the last row's clock (it
    restarted at 0 in the same file; a restart that stayed above the last row's time is not seen)."""
    paths = [Path(d) for d in run_dirs]
    names = [p.resolve().name for p in paths]
    runs: dict[str, list[dict[str, Any]]] = {}
    for path, name in zip(paths, names, strict=True):
        metrics = metrics_path(path)
        if not metrics.is_file():
            raise UsageError(f"{path} has no metrics.jsonl: is it a ddprl run directory?")
        try:
            records = read_metrics(path)
        except json.JSONDecodeError as e:
            raise UsageError(f"{metrics} holds a line that is not JSON ({e.msg})") from None
        if not records:
            raise UsageError(f"{metrics} is empty: the run has logged nothing yet")
        offset, last = 0.0, None
        for r in records:
            if "wall_time" in r:
                if last is not None and r["wall_time"] < last:
                    offset += last
                last = r["wall_time"]
                r["wall_time"] += offset
        runs[str(path) if names.count(name) > 1 else name] = records
    return runs


def _did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    near = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def _brief(keys: list[str], limit: int = 12) -> str:
    """A one-line list: runs log dozens of keys (``rank<r>/...`` among them)."""
    more = f", ... ({len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more
