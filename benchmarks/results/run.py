"""Published results, reproduced: run one row of docs/results.md, or rebuild the page.

    python benchmarks/results/run.py ROW [--seeds 3]      # train each seed, keep its curve, summarise
    python benchmarks/results/run.py --page               # docs/results.md and its PNGs from what is kept
    python benchmarks/results/run.py --list               # the rows and their commands

Each seed trains with ``ddprl train`` (the row's keys, then ``seed=K``) in a scratch directory;
its ``metrics.jsonl`` and ``config.yaml`` are kept under ``benchmarks/results/runs/<row>/seed<K>/``
(small, committed, so anyone can re-plot), checkpoints and TensorBoard files are not.
``summary.json`` beside them holds what the page shows: per seed the evaluation return at the
reference's step count, the best and the final one, the wall time and the machine. The page is
built only from those files, so its numbers are the ones the runs printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = HERE / "runs"
PAGE = ROOT / "docs" / "results.md"
IMAGES = ROOT / "docs" / "results"
sys.path.insert(0, str(HERE.parent))  # benchmarks/machine.py


EVAL = "eval/return_mean"  # greedy actions, separate evaluation episodes
TRAIN = "train/episode_return"  # the training episodes' return: sampled actions, as CleanRL reports it


@dataclass(frozen=True)
class Reference:
    """A published number: ``value`` (± ``std`` when the source gives one) at ``steps``, measured
    as ddprl's ``metric`` is."""

    source: str  # who, where (paper table or repository file), what the std is over
    value: float
    std: float | None
    steps: int
    metric: str = EVAL


@dataclass(frozen=True)
class Row:
    title: str
    keys: tuple[str, ...]  # `ddprl train` keys; seed= and run_dir= are added per run
    references: tuple[Reference, ...]
    note: str = ""  # why ddprl differs from the reference, where it does by design

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys)


METRIC_NAMES = {EVAL: "evaluation return", TRAIN: "training episodes' return"}
CLEANRL = (
    "CleanRL `docs/benchmark/ppo_continuous_action.md` (Open RL Benchmark tag pr-424, {task}-v4, "
    "1M steps; the training episodes' return at the end of training, ± over 3 seeds)"
)
ZOO = "SB3 zoo `benchmark.md` (rl-baselines3-zoo, one trained agent; ± over its evaluation episodes)"
ROWS: dict[str, Row] = {
    "ppo-cartpole": Row(
        "PPO, CartPole-v1",
        ("task=CartPole-v1", "world_size=2", "steps=100000", "eval_freq=10000"),
        (Reference(ZOO, 500.0, 0.0, 100_000),),
    ),
    "ppo-acrobot": Row(
        "PPO, Acrobot-v1",
        ("task=Acrobot-v1", "world_size=2", "steps=1000000"),
        (Reference(ZOO, -73.506, 18.201, 1_000_000),),
    ),
    "ppo-pendulum": Row(
        "PPO, Pendulum-v1",
        ("task=Pendulum-v1", "world_size=2", "steps=200000", "eval_freq=10000"),
        (Reference(ZOO + ", with gSDE exploration", -172.225, 104.159, 100_000),),
        note="The zoo's agent explores with gSDE, which ddprl's PPO does not have; ddprl's preset "
        "normalises observations and rewards instead (docs/ppo.md, task presets).",
    ),
    "ppo-mountaincar": Row(
        "PPO, MountainCarContinuous-v0",
        ("task=MountainCarContinuous-v0", "world_size=2", "eval_freq=10000"),
        (Reference(ZOO + ", with gSDE exploration", 88.343, 2.572, 20_000),),
        note="The zoo's agent explores with gSDE and a small initial action noise; ddprl's preset keeps "
        "the default Gaussian (std 1) with the zoo's discount and normalisation.",
    ),
    "ppo-lunarlander": Row(
        "PPO, LunarLander-v3",
        ("task=LunarLander-v3", "world_size=2"),
        (Reference(ZOO + " (LunarLander-v2: the same task before Gymnasium's fixes)", 242.119, 31.823, 1_000_000),),
    ),
    "ppo-lunarlander-minibatch64": Row(
        "PPO, LunarLander-v3, the zoo's minibatch",
        ("task=LunarLander-v3", "world_size=2", "batch_size=32"),
        (Reference(ZOO + " (LunarLander-v2: the same task before Gymnasium's fixes)", 242.119, 31.823, 1_000_000),),
        note="batch_size is per rank: on 2 ranks the preset's 64 makes minibatches of 128 and half the zoo's "
        "optimizer steps; batch_size=32 on 2 ranks gives the zoo's 64 (the row above keeps the preset as is).",
    ),
    "ppo-halfcheetah": Row(
        "PPO, HalfCheetah-v5",
        ("task=HalfCheetah-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (
            Reference(CLEANRL.format(task="HalfCheetah"), 1442.64, 46.03, 1_000_000, TRAIN),
            Reference(ZOO + ", HalfCheetah-v3, tuned keys (not the paper's)", 5819.099, 663.530, 1_000_000),
        ),
    ),
    "ppo-hopper": Row(
        "PPO, Hopper-v5",
        ("task=Hopper-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (
            Reference(CLEANRL.format(task="Hopper"), 2382.86, 271.74, 1_000_000, TRAIN),
            Reference(ZOO + ", Hopper-v3, tuned keys", 2410.435, 10.026, 1_000_000),
        ),
    ),
    "ppo-walker2d": Row(
        "PPO, Walker2d-v5",
        ("task=Walker2d-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (
            Reference(CLEANRL.format(task="Walker2d"), 2287.95, 571.78, 1_000_000, TRAIN),
            Reference(ZOO + ", Walker2d-v3, tuned keys", 3478.798, 821.708, 1_000_000),
        ),
    ),
}


@dataclass(frozen=True)
class SupervisedRow:
    """ddprl's Trainer against baselines fitted on the same train split (train + val: ddprl picks
    its epoch on val), both scored on the same test split."""

    title: str
    keys: tuple[str, ...]
    dataset: str  # the task: a scikit-learn bundled set of ddprl.supervised.tasks, or graph_energy
    metric: str = "accuracy"  # the test metric compared (ddprl logs it as test/<metric>)

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys)

    def baselines(self, seed: int) -> dict[str, float]:
        return graph_baselines() if self.dataset == "graph_energy" else sklearn_baselines(self.dataset, seed)


SUPERVISED_ROWS: dict[str, SupervisedRow] = {
    "supervised-digits": SupervisedRow(
        "Supervised, digits (MLP 128-128)", ("algo=supervised", "task=digits", "world_size=2"), "digits"
    ),
    "supervised-breast-cancer": SupervisedRow(
        "Supervised, breast_cancer (MLP 128-128)",
        ("algo=supervised", "task=breast_cancer", "world_size=2"),
        "breast_cancer",
    ),
    "supervised-graph-energy": SupervisedRow(
        "Supervised, graph_energy (GNN, 2 layers of 64)",
        ("algo=supervised", "task=graph_energy", "world_size=2"),
        "graph_energy",
        metric="mse",
    ),
}
COMMON = ("progress=false", "checkpoint_freq=0", "keep_last=1")
NOT_YET = [
    "",
    "## Not reproduced yet",
    "",
    "- PPO on LunarLander-v3 and the MuJoCo tasks at 1M steps (rows above, commands ready): about",
    "  5 min per 1M steps of a classic-control task on the 2-core machine these pages were made on,",
    "  several times that for MuJoCo. The closer reference for the MuJoCo presets is CleanRL's",
    "  published `ppo_continuous_action` results (the same hyperparameters), beside the zoo's tuned agents.",
    "- QMIX on EPyMARL's protocol (2M environment steps, 100 greedy test episodes every 50k)",
    "  against Papoudakis et al. 2021 (arXiv 2006.07869): docs/benchmarks.md has the 200k-step",
    "  comparison with EPyMARL run on the same machine.",
    "- The JAX engine against PureJaxRL, and TD-MPC2 at 100k environment steps against the",
    "  official per-task results: docs/benchmarks.md has the measurements made so far.",
]


def sklearn_baselines(dataset: str, seed: int) -> dict[str, float]:
    """Test accuracy of scikit-learn models on ddprl's split (split_seed=0, standardised with the
    training statistics), fitted on train + val."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    from ddprl.supervised.tasks import _tabular_splits

    splits = _tabular_splits(dataset, 0)
    x_fit = torch.cat([splits["train"][0], splits["val"][0]]).numpy()
    y_fit = torch.cat([splits["train"][1], splits["val"][1]]).numpy()
    x_test, y_test = (t.numpy() for t in splits["test"])
    models = {
        "scikit-learn LogisticRegression": LogisticRegression(max_iter=5000),
        "scikit-learn MLPClassifier (128, 128), early stopping": MLPClassifier(
            (128, 128), early_stopping=True, max_iter=500, random_state=seed
        ),
    }
    return {name: float(model.fit(x_fit, y_fit).score(x_test, y_test)) for name, model in models.items()}


GRAPH_BINS = 100


def graph_baselines() -> dict[str, float]:
    """Test MSE (of the standardised energy) on ddprl's graph_energy split (its default options):
    the training mean, and a linear model on what the energy is a function of, the number of
    particle pairs at each distance (edges counted in GRAPH_BINS distance bins up to the cutoff).
    The linear model is told the answer's form (a sum of pair terms), the GNN is not: a bound
    rather than a peer."""
    import numpy as np
    import torch
    from sklearn.linear_model import RidgeCV

    from ddprl.supervised.graph import OPTIONS, graph_splits

    splits = graph_splits(*(OPTIONS[k] for k in ("num_graphs", "min_nodes", "max_nodes", "radius", "split_seed")))
    edges = np.linspace(0.0, OPTIONS["radius"], GRAPH_BINS + 1)

    def features(graphs) -> tuple[np.ndarray, np.ndarray]:
        counts = []
        for g in graphs:
            src, dst = g.edge_index
            d = torch.linalg.vector_norm(g.pos[dst] - g.pos[src], dim=1)[src < dst]  # each pair once
            counts.append(np.histogram(d.numpy(), bins=edges)[0])
        return np.array(counts, dtype=np.float64), np.array([g.y.item() for g in graphs])

    x_fit, y_fit = features(splits["train"] + splits["val"])
    x_test, y_test = features(splits["test"])
    predicted = RidgeCV(alphas=np.logspace(-6, 2, 9)).fit(x_fit, y_fit).predict(x_test)
    return {
        "the training mean": float(np.mean((y_fit.mean() - y_test) ** 2)),
        f"scikit-learn RidgeCV on pair counts in {GRAPH_BINS} distance bins": float(np.mean((predicted - y_test) ** 2)),
    }


def curve(metrics: Path, key: str = EVAL) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
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


def measure(metrics: Path, ref: Reference) -> float | None:
    """ddprl's number to set beside ``ref``, measured as ``ref`` is."""
    if ref.metric == TRAIN:
        return window_mean(curve(metrics, TRAIN), ref.steps)
    return at_steps(curve(metrics, ref.metric), ref.steps)


def run_row(name: str, seeds: int) -> dict:
    from machine import cpu_model

    row = ROWS.get(name) or SUPERVISED_ROWS[name]
    out = RUNS / name
    results = []
    for seed in range(1, seeds + 1):
        with tempfile.TemporaryDirectory() as scratch:
            run_dir = Path(scratch) / "run"
            cmd = [sys.executable, "-m", "ddprl", "train", *row.keys, *COMMON, f"seed={seed}", f"run_dir={run_dir}"]
            print("$", " ".join(cmd[2:]), flush=True)
            start = time.time()
            proc = subprocess.run(
                cmd, cwd=ROOT, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "disable")}
            )
            if proc.returncode != 0:
                raise SystemExit(f"{name} seed {seed}: ddprl train exited {proc.returncode}")
            keep = out / f"seed{seed}"
            keep.mkdir(parents=True, exist_ok=True)
            for file in ("metrics.jsonl", "config.yaml"):
                shutil.copy(run_dir / file, keep / file)
        wall = round(time.time() - start, 1)
        if isinstance(row, SupervisedRow):
            final = json.loads((keep / "metrics.jsonl").read_text().splitlines()[-1])
            results.append(
                {
                    "seed": seed,
                    "wall_s": wall,
                    f"test/{row.metric}": final[f"test/{row.metric}"],
                    "baselines": row.baselines(seed),
                }
            )
        else:
            evals = curve(keep / "metrics.jsonl")
            results.append(
                {
                    "seed": seed,
                    "wall_s": wall,
                    "final": evals[-1][1],
                    "final_step": evals[-1][0],
                    "best": max(r for _, r in evals),
                    "at_reference": [measure(keep / "metrics.jsonl", ref) for ref in row.references],
                }
            )
        print(f"{name} seed {seed}: {results[-1]}", flush=True)
    summary = {
        "row": name,
        "command": row.command(),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "seeds": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def mean_std(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (1 seed)"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def draw(name: str, row: Row) -> Path:
    """Every seed's curves (``ddprl.plot``): the evaluation return, and the training episodes' return
    where a reference is measured on it, each reference drawn as a line and band on its metric."""
    from ddprl.plot import figure, load_runs

    runs = load_runs(sorted((RUNS / name).glob("seed*")))
    metrics = [EVAL] + ([TRAIN] if any(ref.metric == TRAIN for ref in row.references) else [])
    fig = figure(runs, metrics)
    lines: dict[str, list] = {metric: [] for metric in metrics}
    for i, ref in enumerate(row.references):
        ax = fig.axes[metrics.index(ref.metric)]
        colour = f"C{len(runs) + i}"
        label = f"{ref.source.split(' ')[0]} ({ref.steps:,} steps)"
        lines[ref.metric].append(ax.axhline(ref.value, color=colour, linestyle="--", linewidth=1, label=label))
        if ref.std:
            ax.axhspan(ref.value - ref.std, ref.value + ref.std, color=colour, alpha=0.1, linewidth=0)
        ax.axvline(ref.steps, color=colour, linestyle=":", linewidth=1)
    for ax, metric in zip(fig.axes, metrics, strict=True):
        if lines[metric]:
            ax.legend(handles=lines[metric], loc="lower right", fontsize=8)  # the seeds: the figure's legend
        ax.set_title(f"{row.title}: {METRIC_NAMES[metric]}", fontsize=10)
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}.png"
    fig.savefig(path, dpi=90)
    return path


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def on(ref: Reference) -> str:
    """The page's marker for a reference not measured on the evaluation return."""
    return "" if ref.metric == EVAL else " (training episodes)"


def page() -> str:
    lines = [
        "# Results: published numbers, reproduced",
        "",
        "Each row trains ddprl with the command shown, one run per seed, and sets its evaluation",
        "return (the mean over the run's evaluation episodes, greedy actions) at the reference's",
        "step count beside the published number; a reference marked *training episodes* reports the",
        "return of the episodes played while training (sampled actions), and ddprl's number beside it",
        "is the mean of its training episodes' return over the last 5 % of the steps.",
        "`python benchmarks/results/run.py ROW --seeds 3`",
        "reruns a row; `--page` rebuilds this page from the runs kept in `benchmarks/results/runs/`",
        "(their `metrics.jsonl` files: `ddprl plot benchmarks/results/runs/ROW/seed*` redraws them).",
        "Mean ± standard deviation over seeds; a reference's ± is what its source reports.",
        "",
        "| row | reference | steps | ddprl at those steps | ddprl best | seeds | wall time per seed | curve |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for name, row in ROWS.items():
        summary_path = RUNS / name / "summary.json"
        if not summary_path.exists():
            for ref in row.references:
                lines.append(
                    f"| {row.title} | {ref.value:g}{f' ± {ref.std:g}' if ref.std is not None else ''}{on(ref)} "
                    f"| {ref.steps:,} | not run yet | | | | |"
                )
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        image = draw(name, row).relative_to(PAGE.parent)
        wall = statistics.mean(s["wall_s"] for s in seeds)
        for i, ref in enumerate(row.references):
            ours = [s["at_reference"][i] for s in seeds if s["at_reference"][i] is not None]
            lines.append(
                f"| {row.title} | {ref.value:g}{f' ± {ref.std:g}' if ref.std is not None else ''}{on(ref)} "
                f"| {ref.steps:,} | {mean_std(ours)} | {mean_std([s['best'] for s in seeds])} "
                f"| {len(seeds)} | {wall / 60:.1f} min | [png]({image}) |"
            )
        details += [
            f"### {row.title}",
            "",
            f"- command: `{summary['command']}` (+ `seed=K`)",
            f"- reference: {'; '.join(r.source for r in row.references)}",
            f"- machine: {summary['machine']}, {summary['date']}",
            "- per seed (at each reference's steps, measured as it is / best evaluation / final evaluation "
            "at step): "
            + "; ".join(
                f"seed {s['seed']}: {' and '.join(fmt(v) for v in s['at_reference'])} / {s['best']:.1f} "
                f"/ {s['final']:.1f} at {s['final_step']:,}"
                for s in seeds
            ),
        ]
        if row.note:
            details.append(f"- {row.note}")
        details += ["", f"![{row.title}]({image})", ""]
    return "\n".join(lines + supervised_table() + NOT_YET + ["", "## Rows", ""] + details) + "\n"


def supervised_table() -> list[str]:
    lines = [
        "",
        "## Supervised Trainer against baselines on the same split",
        "",
        "The test metric on the same held-out 15 % (ddprl's `split_seed=0` split, features or targets",
        "standardised with the training statistics). ddprl trains on 70 % and keeps the epoch of its",
        "best validation loss; the baselines are fitted on the 85 % of train + validation. On",
        "graph_energy the metric is the mean squared error of the standardised energy (lower is",
        "better; the training mean scores about 1); its linear baseline is told the form of the answer",
        "(a sum of pair terms, so it regresses on the count of pairs at each distance), which the",
        "GNN has to learn from positions: a bound more than a peer.",
        "",
        "| task | command | ddprl, test | baselines, same split | seeds | wall time per seed |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in SUPERVISED_ROWS.items():
        summary_path = RUNS / name / "summary.json"
        if not summary_path.exists():
            lines.append(f"| {row.title} | `{row.command()}` | not run yet | | | |")
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        ours = [s[f"test/{row.metric}"] for s in seeds]
        theirs = "; ".join(
            f"{model}: {mean_std([s['baselines'][model] for s in seeds], digits=4)}" for model in seeds[0]["baselines"]
        )
        wall = statistics.mean(s["wall_s"] for s in seeds)
        lines.append(
            f"| {row.title} | `{summary['command']}` | {row.metric} {mean_std(ours, digits=4)} | {theirs} "
            f"| {len(seeds)} "
            f"| {wall:.0f} s ({summary['machine']}) |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row", nargs="?", choices=sorted({**ROWS, **SUPERVISED_ROWS}))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--page", action="store_true", help="rebuild docs/results.md from the kept runs")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for name, row in {**ROWS, **SUPERVISED_ROWS}.items():
            print(f"{name:26s} {row.command()}")
        return 0
    if args.row:
        run_row(args.row, args.seeds)
    if args.page or args.row:
        PAGE.write_text(page())
        print(f"wrote {PAGE.relative_to(ROOT)}")
    if not (args.row or args.page):
        parser.error("name a ROW, or --page, or --list")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
