"""``ddprl plot``: curves drawn from fake metrics.jsonl files, its errors and its arguments."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from conftest import run_cli

from ddprl.errors import UsageError
from ddprl.plot import compact, default_keys, figure, legend_columns, load_runs, parse_plot_args, plot_runs, y_label


def write_run(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return run_dir


def fake_records(n=20, rate=1.0, fps=9000.0):
    """What MetricsLogger writes for PPO: train keys every iteration, eval keys every 5th."""
    records = []
    for i in range(n):
        step = 512 * (i + 1)
        r = {
            "step": step,
            "wall_time": 0.4 * (i + 1),
            "train/loss": 1.0 / (1 + rate * i),
            "train/pg_loss": -0.01 * math.sin(i),
            "train/v_loss": 2.0 * math.exp(-rate * i / 5),
            "train/approx_kl": 0.01,
            "train/episode_return": 10 + rate * 5 * i,
            "time/global_fps": fps + 100 * math.cos(i),
            "rank0/rollout_s": 0.1,
        }
        if i % 5 == 4:
            r.update({"eval/return_mean": 12 + rate * 5 * i, "eval/return_std": 3.0, "eval/episodes": 10.0})
        records.append(r)
    return records


@pytest.fixture
def two_runs(tmp_path):
    a = write_run(tmp_path / "ppo-a", fake_records(rate=1.0, fps=9000.0))
    b = write_run(tmp_path / "ppo-b", fake_records(rate=0.5, fps=4000.0))
    return a, b


def read_image(path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))


def assert_picture(path):
    """A real picture: sensible size and more than one colour."""
    assert path.is_file() and path.stat().st_size > 0
    img = read_image(path)
    height, width = img.shape[:2]
    assert 300 <= width <= 5000 and 300 <= height <= 5000, img.shape
    assert np.unique(img.reshape(-1, img.shape[-1]), axis=0).shape[0] > 10
    return img


def test_plot_two_runs_default_keys(two_runs, tmp_path):
    out = plot_runs(list(two_runs), out=tmp_path / "sub" / "curves.png")
    assert out == tmp_path / "sub" / "curves.png"
    assert_picture(out)


def test_default_keys_headline_then_losses(two_runs):
    runs = load_runs(list(two_runs))
    available = sorted({k for records in runs.values() for r in records for k in r})
    assert default_keys(available) == [
        "eval/return_mean",
        "train/episode_return",
        "time/global_fps",
        "train/loss",
        "train/pg_loss",
        "train/v_loss",
    ]


def test_default_keys_of_any_run(tmp_path):
    # eval/return_mean only in the second run: still a default subplot.
    a = write_run(tmp_path / "a", [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in fake_records()])
    b = write_run(tmp_path / "b", fake_records())
    assert_picture(plot_runs([a, b], out=tmp_path / "c.png"))


def test_keys_selection_changes_the_picture(two_runs, tmp_path):
    one = assert_picture(plot_runs(list(two_runs), out=tmp_path / "one.png", keys=["eval/return_mean"]))
    many = assert_picture(plot_runs(list(two_runs), out=tmp_path / "many.png"))
    # One subplot is smaller than a grid of six.
    assert one.shape[0] * one.shape[1] < many.shape[0] * many.shape[1]


def test_x_wall_time_and_other_formats(two_runs, tmp_path):
    assert_picture(plot_runs(list(two_runs), out=tmp_path / "t.png", keys=["train/loss"], x="wall_time"))
    for suffix in ("pdf", "svg"):
        out = plot_runs(list(two_runs), out=tmp_path / f"c.{suffix}", keys=["train/loss"])
        assert out.stat().st_size > 1000


def tick_labels(fig):
    """The (x, y) tick labels each subplot shows (matplotlib also labels ticks beyond the view)."""
    fig.canvas.draw()  # tick labels are set when the figure is drawn

    def shown(ticks, labels, limits):
        lo, hi = sorted(limits)
        return [t.get_text() for v, t in zip(ticks, labels, strict=True) if lo <= v <= hi]

    return [
        (
            shown(ax.get_xticks(), ax.get_xticklabels(), ax.get_xlim()),
            shown(ax.get_yticks(), ax.get_yticklabels(), ax.get_ylim()),
        )
        for ax in fig.axes
    ]


def test_axes_readable_steps_and_labelled_y(tmp_path):
    """Steps up to 2M in 10k increments: ticks like 500k / 1.5M, never 1250000 or a 1e6 offset."""
    records = [
        {
            "step": 10240 * i,
            "wall_time": 3.1 * i,
            "train/episode_return": 5.0 * i,
            "time/global_fps": 3000.0 + 100 * i,
            "train/loss": 1 / i,
        }
        for i in range(1, 201)
    ]
    run = write_run(tmp_path / "long", records)
    fig = figure(load_runs([run]), ["train/episode_return", "time/global_fps", "train/loss"])
    assert len(fig.axes) == 3
    for ax, (xs, _ys) in zip(fig.axes, tick_labels(fig), strict=True):
        assert xs and all(re.fullmatch(r"0|\d{1,3}(\.\d{1,2})?[kM]", x) for x in xs), xs
        assert 3 <= len(xs) <= 7, xs
        assert ax.xaxis.get_offset_text().get_text() == ""
        assert ax.get_xlabel() == "global steps" and ax.get_ylabel()
    assert [ax.get_ylabel() for ax in fig.axes] == ["return", "steps / s", "loss"]
    assert "1M" in tick_labels(fig)[0][0]
    fps_ticks = tick_labels(fig)[1][1]
    assert all(t.endswith("k") or t == "0" for t in fps_ticks), fps_ticks  # one style on an axis: 10k, 15k, 20k


def test_wall_time_in_the_unit_of_the_longest_run(tmp_path):
    minutes = write_run(tmp_path / "m", [{"step": i, "wall_time": 60.0 * i, "train/loss": 1.0} for i in range(1, 31)])
    seconds = write_run(tmp_path / "s", [{"step": i, "wall_time": 2.0 * i, "train/loss": 1.0} for i in range(1, 31)])
    fig = figure(load_runs([minutes]), ["train/loss"], x="wall_time")
    assert fig.axes[0].get_xlabel() == "wall time (min)"
    assert max(fig.axes[0].lines[0].get_xdata()) == pytest.approx(30.0)
    assert figure(load_runs([seconds]), ["train/loss"], x="wall_time").axes[0].get_xlabel() == "wall time (s)"
    hours = write_run(tmp_path / "h", [{"step": i, "wall_time": 1800.0 * i, "train/loss": 1.0} for i in range(1, 31)])
    assert figure(load_runs([hours, seconds]), ["train/loss"], x="wall_time").axes[0].get_xlabel() == "wall time (h)"


def test_compact_and_y_label():
    assert [compact(v) for v in (0, 512, 2500, 100_000, 1_000_000, 1_250_000, 2e9, -3000)] == [
        "0",
        "512",
        "2.5k",
        "100k",
        "1M",
        "1.25M",
        "2B",
        "-3k",
    ]
    assert [
        y_label(k)
        for k in (
            "eval/return_mean",
            "train/value_loss",
            "time/rollout_s",
            "time/updates_per_s",
            "train/lr",
            "val/accuracy",
            "train/approx_kl",
        )
    ] == ["return (mean ± std)", "loss", "seconds", "updates / s", "learning rate", "accuracy", "approx kl"]


def test_resumed_run_wall_time_is_cumulative(tmp_path):
    first, second = fake_records(10), fake_records(10)
    for r in second:
        r["step"] += 5120  # the logger of the resumed job starts its clock at 0 again
    run = write_run(tmp_path / "r", first + second)
    times = [r["wall_time"] for r in load_runs([run])["r"]]
    assert times == sorted(times) and times[-1] == pytest.approx(8.0)


def test_same_name_runs_keep_their_paths(tmp_path):
    a = write_run(tmp_path / "sweep1" / "seed0", fake_records())
    b = write_run(tmp_path / "sweep2" / "seed0", fake_records(rate=2))
    assert list(load_runs([a, b])) == [str(a), str(b)]


def test_error_no_metrics(tmp_path, two_runs):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(UsageError, match=r"empty_dir has no metrics.jsonl: is it a ddprl run directory\?"):
        plot_runs([two_runs[0], tmp_path / "empty_dir"], out=tmp_path / "c.png")
    with pytest.raises(UsageError, match="has no metrics.jsonl"):
        plot_runs([tmp_path / "missing"], out=tmp_path / "c.png")


def test_error_empty_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(UsageError, match="metrics.jsonl is empty"):
        plot_runs([run], out=tmp_path / "c.png")


def test_error_unknown_key_suggests(two_runs, tmp_path):
    with pytest.raises(UsageError) as e:
        plot_runs(list(two_runs), out=tmp_path / "c.png", keys=["train/loss", "eval/return_mea"])
    msg = str(e.value)
    assert "no run has 'eval/return_mea'" in msg and "did you mean eval/return_mean" in msg
    assert "keys: " in msg and "\n" not in msg
    assert not (tmp_path / "c.png").exists()


def test_error_bad_x_and_suffix(two_runs, tmp_path):
    with pytest.raises(UsageError, match="x='steps' is not one of step, wall_time"):
        plot_runs(list(two_runs), out=tmp_path / "c.png", x="steps")
    with pytest.raises(UsageError, match=r"must end in \.png, \.pdf, \.svg"):
        plot_runs(list(two_runs), out=tmp_path / "c.jpg")


def test_error_no_usual_metric(tmp_path):
    run = write_run(tmp_path / "r", [{"step": 1, "wall_time": 0.1, "custom/thing": 1.0}])
    with pytest.raises(UsageError, match="pick with keys=.*custom/thing"):
        plot_runs([run], out=tmp_path / "c.png")
    assert_picture(plot_runs([run], out=tmp_path / "c.png", keys=["custom/thing"]))


def test_parse_plot_args():
    assert parse_plot_args(["runs/a", "runs/b"]) == (["runs/a", "runs/b"], {})
    dirs, opts = parse_plot_args(["runs/a", "out=x/c.pdf", "keys=[eval/return_mean, train/loss]", "x=wall_time"])
    assert dirs == ["runs/a"]
    assert opts == {"out": "x/c.pdf", "keys": ["eval/return_mean", "train/loss"], "x": "wall_time"}
    assert parse_plot_args(["a", "keys=train/loss,time/global_fps"])[1] == {"keys": ["train/loss", "time/global_fps"]}
    # '=' in a path: not a key=value unless the part before it is a plain identifier.
    assert parse_plot_args(["runs/lr=3e-4", "./x=1"]) == (["runs/lr=3e-4", "./x=1"], {})


def test_parse_plot_args_errors():
    with pytest.raises(UsageError, match="plot: give at least one RUN_DIR"):
        parse_plot_args(["out=c.png"])
    with pytest.raises(UsageError, match=r"unknown key 'key' \(did you mean keys\?\)"):
        parse_plot_args(["runs/a", "key=train/loss"])
    with pytest.raises(UsageError, match="keys= names no metric"):
        parse_plot_args(["runs/a", "keys=[]"])


@pytest.mark.slow
def test_plot_cli(two_runs, tmp_path):
    png = tmp_path / "cli" / "curves.png"
    res = run_cli(["plot", str(two_runs[0]), str(two_runs[1]), f"out={png}"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert png.is_file()


def test_a_run_kept_gzipped_reads_and_draws_as_the_plain_one(two_runs, tmp_path):
    """The results page keeps its runs as ``metrics.jsonl.gz`` (benchmarks/results/run.py): the
    same records, the same picture; a directory with neither file is still refused."""
    import gzip
    import shutil

    plain, _ = two_runs
    packed = tmp_path / "packed" / plain.name
    packed.mkdir(parents=True)
    with open(plain / "metrics.jsonl", "rb") as src, gzip.open(packed / "metrics.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert load_runs([packed]) == load_runs([plain])
    a = read_image(plot_runs([plain], out=tmp_path / "plain.png"))
    b = read_image(plot_runs([packed], out=tmp_path / "packed.png"))
    assert np.array_equal(a, b)
    (packed / "metrics.jsonl.gz").unlink()
    with pytest.raises(UsageError, match="has no metrics.jsonl"):
        load_runs([packed])


def test_long_run_names_wrap_the_legend_onto_more_rows():
    """Three runs named 'seedK, in progress' on a one-panel figure (4.8 inches) ran past both
    edges in one row of three; short names still share one row."""
    from matplotlib.figure import Figure  # matplotlib: an extra, imported where a test needs it

    fig = Figure(figsize=(4.8, 3.4))
    assert legend_columns(fig, [f"seed{k}, in progress" for k in (1, 2, 3)]) == 2
    assert legend_columns(fig, ["seed1", "seed2", "seed3"]) == 3
    assert legend_columns(Figure(figsize=(9.6, 3.4)), [f"seed{k}, in progress" for k in (1, 2, 3)]) == 3


def test_styles_give_a_run_its_line_and_band_colour(two_runs):
    """A run named in ``styles`` draws with those line keywords (dashed, the other run's colour) and
    its evaluation band in the same colour; the run not named keeps its default."""
    from matplotlib.colors import to_rgba

    runs = load_runs(list(two_runs))
    styles = {"ppo-b": {"color": "C0", "linestyle": "--"}}
    ax = figure(runs, ["eval/return_mean"], styles=styles).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["ppo-a"].get_color() == lines["ppo-b"].get_color() == "C0"
    assert lines["ppo-a"].get_linestyle() == "-" and lines["ppo-b"].get_linestyle() == "--"
    bands = [tuple(band.get_facecolor()[0][:3]) for band in ax.collections]
    assert bands == [to_rgba("C0")[:3]] * 2
    default = figure(runs, ["eval/return_mean"]).axes[0]
    assert [line.get_color() for line in default.get_lines()] == ["C0", "C1"]


def test_the_picture_goes_beside_the_runs_unless_out_says(two_runs, tmp_path):
    a, b = two_runs
    assert plot_runs([a]) == a / "curves.png" and (a / "curves.png").is_file()
    assert plot_runs([a, b]) == tmp_path / "curves.png" and (tmp_path / "curves.png").is_file()
    assert plot_runs([a], out=tmp_path / "x.svg") == tmp_path / "x.svg"
