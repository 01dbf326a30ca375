"""docs/results.md, docs/results.csv and docs/results/<suite>.png, built only from the runs kept under ``runs/``:
every ddprl number is computed here from the kept metrics, every reference is a cited value of rows.py or
computed from a peer library's runs kept beside ddprl's."""

from __future__ import annotations

import csv
import functools
import io
import json
import re
import statistics
import textwrap
from dataclasses import dataclass

import numpy as np

from . import figures, provenance, stats, store
from . import rows as R
from .store import at_steps, curve, mean_std, welch, window_mean
from .training import IN_PROGRESS, LOST

RUN = "python benchmarks/results/run.py"
HEADER = f"""# Results: ddprl against published numbers and peer libraries

Each row trains ddprl from scratch, one run per seed, and sets its score beside a published number or a peer
library run on the same machine with the same budget. Scores are the interquartile mean (IQM) over seeds with its
95 % stratified-bootstrap interval (Agarwal et al. 2021, the `rliable` method); a reference with per-seed numbers
gets the same, one with a mean only (shown ± its std over what it says) is compared as that value. The verdict:
ddprl's interval lies above, below, or overlaps (within) the reference's. The figures: each implementation's IQM
over seeds at each step, its 95 % interval shaded ({figures.REPS:,} replicates). A commit marked * was recorded
after the run, from git history (the commit before the run was kept); a row marked stale ran keys its command now
gives otherwise. Per-seed values with each run's commit, machine and torch: [results.csv](results.csv);
`{RUN} --page` rebuilds page, CSV and figures from `benchmarks/results/runs/`.
"""
COLUMNS = "| task | row | ddprl IQM [95 % CI] | reference | source | metric | verdict | seeds | commit | machine |"
JAX = "The JAX engine against PureJaxRL, on the same CPU"
YLABELS = {R.TRAIN: "training episode return", R.EVAL: "return, greedy evaluation", R.WON: "greedy battles won"}
SECONDS = ("wall_s", "compile_s", "train_s")
PROVENANCE = ("commit", "library_commit", "machine", "torch", "date")  # of each kept run, in the CSV
NOTES = {
    "": "A published reference's ± is what its source reports. Runs at commits before `4a9eb82` (evaluation seeds "
    "not yet hashed) shared all but one evaluation environment between consecutive seeds, so their std is over "
    "largely the same episodes: seeds 1-3 of the LunarLander, CartPole, Acrobot, v5 HalfCheetah, Hopper and Walker2d "
    "rows, the QMIX LBF, RWARE and MPE rows (MPE bootstrap: seed 1), the JAX engine's Breakout row "
    "(seeds 1-6) and TD-MPC2's runs but reacher-easy's seed 3 and finger-spin's 2-3.",
    "PPO": "The SB3 zoo's numbers are one agent's evaluation episodes on older task versions; CleanRL's the "
    "training episodes' return at 1M steps over 3 seeds, on v4 tasks. CleanRL run here: its unchanged "
    "`ppo_continuous_action.py`, a seed a core, on the gymnasium 0.29.1 and mujoco 2.3.3 it pins.",
    "QMIX": "Reference: EPyMARL's QMIX run here on the same task and protocol (100 greedy test episodes every 50k), "
    "Papoudakis et al. 2021 (arXiv 2006.07869) Table 3 not being transcribed (no copy was reachable). `-epymarl` "
    "rows run EPyMARL's QMIX settings (raw mixer states, unbootstrapped time limits, 32 episodes an update).\n"
    "simple_spread: returns per agent (team return / 3), as Papoudakis et al. report; EPyMARL steps PettingZoo "
    "1.24.3's simple_spread_v3, whose wrapper reports 0 for an episode's 25th step.\n"
    "SMAX rows: the share of greedy test battles won (32 a test), against JaxMARL's QMIX run here "
    f"({R.JAXMARL_REPO} `baselines/QLearning/qmix_rnn.py` with its `ql_rnn_smax` configuration) on the same battle "
    "and budget; JaxMARL's own runs of that configuration go to 10M steps, and its paper's SMAX curves (Rutherford et "
    "al. 2024, no table of numbers) are not transcribed here.",
    "TD-MPC2": "CPU rows: model_size 1 (1M parameters), 4 evaluation episodes; GPU rows: the CSVs' model_size 5, "
    "compiled, the official 10 (`bash benchmarks/gpu_session.sh results`, about a seed a session). Agent steps "
    "(action repeat 2). Attempts whose checkpoint was lost are kept in runs/ROW/lost/, counting for nothing.",
    JAX: f"PureJaxRL's PPO ({R.PUREJAXRL_REPO} `purejaxrl/ppo.py` at `{R.PUREJAXRL_COMMIT[:7]}`; MinAtar: its "
    "`examples/brax_minatar.ipynb` configuration) and ddprl's engines with its hyperparameters (rows.py's "
    "`ddprl_ppo_keys`), one run at a time. Still different: PureJaxRL normalises advantages per minibatch and ends "
    "an episode at a time limit (ddprl: per rollout, bootstrapped); ddprl torch steps Gymnasium's tasks.",
    "Supervised": "The same held-out 15 % (`split_seed=0`): ddprl trains on 70 % and keeps its best validation "
    "epoch, the baselines fit train + validation. graph_energy: MSE of the standardised energy; its ridge baseline "
    "is told the answer's form (pair counts by distance), a bound more than a peer.",
}


seed_runs = functools.cache(store.seed_runs)


def k(steps: int) -> str:
    return f"{steps / 1e6:.3g}M" if steps >= 1e6 else f"{steps / 1e3:.3g}k"


def described(metric: str, steps: int | None) -> str:
    if metric == R.TRAIN:
        return f"training episodes, last 5 % of {k(steps)}"
    return f"greedy eval at {k(steps)}" if steps else "final greedy test"


SUITES = {  # the page's tables: each row's suite by its name's start, in this order
    "PPO, classic control": ("ppo-cartpole", "ppo-acrobot", "ppo-pendulum", "ppo-mountaincar", "ppo-lunarlander"),
    "PPO, MuJoCo": ("ppo-halfcheetah", "ppo-hopper", "ppo-walker2d", "ppo-ant", "ppo-humanoid"),
    "PPO, Atari": ("ppo-atari",),
    "QMIX, LBF, RWARE and MPE": ("qmix-lbf", "qmix-rware", "qmix-mpe"),
    "QMIX, SMAX": ("qmix-smax",),
    "TD-MPC2, DeepMind Control": ("tdmpc2-",),
    JAX: ("jax-",),
    "Supervised": ("supervised-",),
}


@dataclass(frozen=True)
class Across:
    """A suite whose tasks share a scale, so that its runs pool over tasks (rliable's aggregate IQM and performance
    profile): the tasks in words, the scale, the scores that scale maps to 0 and 1 (one pair for every task, or
    each task's own by its ``task=`` key), and ddprl's configurations, each with the rows it pools (one a task; a
    row's per-seed reference pools alike)."""

    tasks: str
    scale: str
    bounds: tuple[float, float] | dict[str, tuple[float, float]]
    configurations: dict[str, tuple[str, ...]]

    def normalised(self, scores: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
        """``scores`` (runs x the tasks of the rows ``names``) on the scale's [0, 1]."""
        bounds = [self.bounds if isinstance(self.bounds, tuple) else self.bounds[R.ROWS[n].key("task")] for n in names]
        low, high = np.array(bounds, dtype=float).T
        return (scores - low) / (high - low)


LBF = ("8x8-2p-2f-coop", "2s-8x8-2p-2f-coop", "10x10-3p-3f")
D4RL = {  # Fu et al. 2020, d4rl/infos.py: the return of a random policy and of an expert, on the v2 tasks
    "HalfCheetah-v4": (-280.178953, 12135.0),
    "Hopper-v4": (-20.272305, 3234.3),
    "Walker2d-v4": (1.629008, 4592.3),
    "Ant-v4": (-325.6, 3879.7),
}
ACROSS = {
    "PPO, MuJoCo": Across(
        "MuJoCo, D4RL's 4 tasks (v4)",
        "D4RL score (0: random, 1: expert)",
        D4RL,
        {"ddprl": tuple(f"ppo-{task.lower()}" for task in D4RL)},
    ),
    "QMIX, LBF, RWARE and MPE": Across(
        "LBF, 3 tasks",
        "team return (1: all the food loaded)",
        (0, 1),
        {
            "ddprl": tuple(f"qmix-lbf-{task}" for task in LBF),
            "ddprl, EPyMARL's settings": tuple(f"qmix-lbf-{task}-epymarl" for task in LBF),
        },
    ),
    "QMIX, SMAX": Across(
        "SMAX, 3 battles", "win rate", (0, 1), {"ddprl": ("qmix-smax-3m", "qmix-smax-2s3z", "qmix-smax-5m_vs_6m")}
    ),
    "TD-MPC2, DeepMind Control": Across(
        "DMC, 3 tasks",
        "return / 1,000",
        (0, 1000),
        {"ddprl, model_size 1 on a CPU": ("tdmpc2-cartpole-swingup", "tdmpc2-reacher-easy", "tdmpc2-finger-spin")},
    ),
}
TAUS = np.linspace(0.0, 1.0, 101)  # the performance profiles' thresholds on the [0, 1] scale


def suite_of(name: str) -> str:
    return next(suite for suite, starts in SUITES.items() if name.startswith(starts))


@dataclass(frozen=True)
class Pair:
    """A table line whose reference has per-seed numbers: its row, the reference's source, and both sides' runs
    (negated where lower is better, so that higher is better in every pair)."""

    row: str
    source: str
    ours: tuple[float, ...]
    theirs: tuple[float, ...]


@dataclass(frozen=True)
class Versus:
    """What a table line sets ddprl against: its cell, the interval a verdict compares with (a published mean
    alone: that value at both ends; None: nothing to compare) and its number of runs ("": not given)."""

    cell: str
    interval: tuple[float, float] | None
    runs: str = ""
    values: tuple[float, ...] = ()  # its runs' scores, where known: for the probability of improvement


def scored(values: list[float] | np.ndarray, digits: int) -> tuple[str, tuple[float, float] | None]:
    """Seeds' cell, IQM [95 % CI], and the interval (one seed: its value, no interval); a matrix: runs x tasks."""
    if len(values) < 2:
        return (f"{values[0]:.{digits}f} (1 seed)" if values else ""), None
    low, high = stats.bootstrap_interval(values)
    return f"{stats.iqm(values):.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]", (low, high)


def runs_here(values: list[float], digits: int) -> Versus:
    """Another library's runs kept here as the reference."""
    cell, interval = scored(values, digits)
    return Versus(cell or "not run", interval, str(len(values)), tuple(values))


def published(ref: R.Reference, digits: int) -> Versus:
    """A published number: its per-seed values where the source gives them, else its mean (± what it says)."""
    if ref.seeds:
        cell, interval = scored(list(ref.seeds), digits)
        return Versus(cell, interval, str(len(ref.seeds)), ref.seeds)
    over = ref.spread.removeprefix("std over ").replace("episodes of 1 agent", "1 agent's episodes")
    spread = f" ± {ref.std!r} ({over})" if ref.std is not None else ""
    return Versus(f"{ref.value!r}{spread}", (ref.value, ref.value))


def stale(name: str, prefix: str = "seed") -> list[str]:
    """Each key the row now gives another value of than its kept seeds ran, with those seeds."""
    changed: dict[str, list[str]] = {}
    for seed in (s["seed"] for s in (store.kept_summary(name) or {"seeds": []})["seeds"]):
        for key in provenance.stale_keys(name, store.RUNS / name / f"{prefix}{seed}"):
            changed.setdefault(key, []).append(str(seed))
    return [f"{key} (seed{'s' * (len(seeds) > 1)} {', '.join(seeds)})" for key, seeds in changed.items()]


def made(name: str, prefix: str = "seed") -> tuple[str, str]:
    """The table's commit and machine cells: each distinct one of the row's kept seeds (a commit recorded
    afterwards, from git history, marked *)."""
    kept = [store.provenance_of(name, prefix, seed) for seed, _ in seed_runs(name, prefix)]
    commits = dict.fromkeys(
        f"`{p['commit'][:7]}`" + ("*" if (p["recorded"] or "").startswith("afterwards") else "")
        for p in kept
        if p["commit"]
    )
    machines = dict.fromkeys(p["machine"] for p in kept if p["machine"])
    return ", ".join(commits) or "—", "; ".join(machines) or "—"


class Page:
    """The tables' lines, the CSV's records, the verdicts and the figure's panels, built row by row."""

    def __init__(self) -> None:
        self.csv: dict[tuple, tuple] = {}
        self.panels: dict[str, list[figures.Panel]] = {}
        self.tables: dict[str, list[str]] = {suite: [] for suite in SUITES}
        self.verdicts: dict[str, list[str]] = {suite: [] for suite in SUITES}
        self.stale: dict[str, list[str]] = {}  # row: the keys its kept runs ran otherwise
        self.pairs: dict[str, list[Pair]] = {suite: [] for suite in SUITES}

    def values(self, name, algo, task, metric, steps=None, agents=1, prefix="seed", what=None) -> list[float]:
        """Each kept seed's ``metric`` at ``steps`` (TRAIN: the mean over the last 5 %; no steps: its last value)
        divided by ``agents``, recorded for the CSV with the run's provenance."""
        out = []
        for seed, rows in seed_runs(name, prefix):
            points = curve(rows, metric)
            value = points[-1][1] if steps is None else (window_mean if metric == R.TRAIN else at_steps)(points, steps)
            if value is not None:
                key, value = (name, algo, seed, what or described(metric, steps)), value / agents
                made_by = store.provenance_of(name, prefix, seed)
                self.csv[key] = (task, value, rows[-1]["step"], *(made_by[f] or "" for f in PROVENANCE))
                out.append(value)
        return out

    def line(self, suite, task, label, ours, versus: Versus, source, metric, digits=1, **more) -> None:
        """A table line of ``suite`` and its verdict. ``more``: ``none``, ddprl's cell when no seed is kept;
        ``made``, the commit and machine cells; ``lower``, True where lower is better (said in the verdict);
        ``stale``, the keys the kept runs ran otherwise (the row marked, its verdict counted apart)."""
        cell, interval = scored(ours, digits)
        verdict = stats.verdict(interval, versus.interval) if interval and versus.interval else "—"
        self.verdicts[suite].append(verdict)
        if ours and versus.values:  # lower better: negated, so that "above" is better here too
            sign = -1 if more.get("lower") else 1
            signed = tuple(sign * v for v in ours), tuple(sign * v for v in versus.values)
            self.pairs[suite].append(Pair(label.split("`")[1], source, *signed))
        if more.get("lower") and verdict != "within" and verdict != "—":
            verdict += " (worse)" if verdict == "above" else " (better)"
        seeds = f"{len(ours)}" + (f" / {versus.runs}" if versus.runs else "")
        commit, machine = more.get("made") or ("—", "—")
        if more.get("stale"):
            label += " (stale: notes)"
            self.verdicts[suite][-1] += " stale"  # counted apart: its verdict is of runs of other keys
            self.stale[label.split("`")[1]] = more["stale"]
        cells = [task, label, cell or more.get("none", "not run"), versus.cell, source, metric, verdict, seeds]
        self.tables[suite].append("| " + " | ".join([*cells, commit, machine]) + " |")

    def panel(self, suite, title, metric, series, agents=1, ref: R.Reference | None = None) -> None:
        """A figure panel of ``suite``: for each (label, colour, row, prefix) of ``series``, the kept seeds' curves
        of ``metric`` (prefix IN_PROGRESS: the seeds in training), and the reference's line."""
        drawn = []
        for label, colour, name, prefix in series:
            seeds = [[(s, v / agents) for s, v in curve(rows, metric)] for _, rows in runs_of(name, prefix)]
            if seeds := [points for points in seeds if points]:
                drawn.append(figures.Series(label, colour, seeds))
        if drawn:
            line = (ref.value, ref.std) if ref else None
            what = f"{ref.who} ({'train' if ref.metric == R.TRAIN else 'eval'})" if ref else ""
            xlabel = "agent steps (millions)" if suite.startswith("TD-MPC2") else "environment steps (millions)"
            panel = figures.Panel(title, YLABELS[metric], drawn, line, what, xlabel)
            self.panels.setdefault(suite, []).append(panel)


def metric_of(row: R.Row) -> str:
    """What a row's table and panel measure: the win rate on SMAX, else its first reference's metric."""
    if row.jaxmarl or (row.key("task") or "").startswith("smax/"):
        return R.WON
    return row.references[0].metric if row.references else R.EVAL


RECONSTRUCTION = "QMIX with a graph reconstructer"
STAGE_KEYS = (  # stage 2's decoded-feature error on the missing nodes, its baselines and floor; token accuracy
    ("val/missing_feature_mse", "prediction"),
    ("val/missing_feature_mse_nothing", "predict nothing (the zeros seen)"),
    ("val/missing_feature_mse_type_mean", "each node type's mean"),
    ("val/missing_feature_mse_true_tokens", "the true tokens decoded (floor)"),
)


def paragraph(text: str) -> str:
    """Prose lines of at most 120 characters; a table line as it is."""
    if text.startswith("|"):
        return text
    return "\n".join(textwrap.wrap(text, width=120, break_on_hyphens=False, break_long_words=False)) + (
        "\n" if text.endswith("\n") else ""
    )


def reconstruction_table(p: Page) -> list[str]:
    """QMIX on smax/3m at sight 6 seeing the limited observation, the reconstructed one and the full one: each row's
    final greedy win rate, IQM with its 95 % stratified-bootstrap interval, and the verdict against the limited
    view's interval; then stage 2's error on the nodes the agents miss."""
    lines = [
        "| row | QMIX sees | final win rate, IQM [95 % CI] | mean ± std | against sight-limited | seeds |",
        "|---|---|---|---|---|---|",
    ]
    limited = None
    for name, (sees, _) in R.RECONSTRUCTION_ROWS.items():
        ours = p.values(name, "QMIX", "smax/3m sight 6", R.WON, what="win rate, final greedy test at 500k")
        p.panel(RECONSTRUCTION, f"QMIX sees: {sees}", R.WON, [("ddprl", "C0", name, "seed")])
        if not ours:
            lines.append(f"| `{name}` | {sees} | not run | | | 0 |")
            continue
        if len(ours) < 2:  # one seed: no interval
            lines.append(f"| `{name}` | {sees} | {ours[0]:.3f} | {mean_std(ours, 3)} | — | 1 |")
            continue
        interval = stats.bootstrap_interval(ours)
        limited = limited or interval
        verdict = "—" if interval is limited else stats.verdict(interval, limited)
        iqm = f"{stats.iqm(ours):.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"
        lines.append(f"| `{name}` | {sees} | {iqm} | {mean_std(ours, 3)} | {verdict} | {len(ours)} |")
    stage = store.RUNS / (R.STAGES.rsplit("/", 1)[1]) / "mask_predictor"
    if stage.is_dir():
        last = [r for r in store.read_rows(stage) if STAGE_KEYS[0][0] in r][-1]
        errors = ", ".join(f"{what} {last[key]:.3f}" for key, what in STAGE_KEYS)
        lines += [
            "",
            f"Stage 2 (the kept mask predictor, its last validation epoch), squared error of the decoded features on "
            f"the missing nodes (unseen, present with full sight): {errors}; missing-token accuracy "
            f"{last['val/missing_token_accuracy']:.3f} (type mean "
            f"{last['val/missing_token_accuracy_type_mean']:.3f}).",
        ]
    return lines


def rl_tables(p: Page) -> None:
    qmix = k(R.QMIX_STEPS)
    for name, row in R.ROWS.items():
        if name in R.RECONSTRUCTION_ROWS:  # a table of their own
            continue
        algo, task = {"qmix": "QMIX", "tdmpc2": "TD-MPC2"}.get(row.key("algo"), "PPO"), row.key("task")
        suite, label = suite_of(name), f"`{name}`"
        for ref in row.references:
            where = ref.who + ("" if ref.task == task else f", {ref.task}")  # the task column: ddprl's
            what = described(ref.metric, ref.steps) + (" agent steps" if algo == "TD-MPC2" else "")
            ours = p.values(name, algo, task, ref.metric, ref.steps, what=what)
            training, lost = attempts(name, IN_PROGRESS), attempts(name, LOST)
            none = "in training (notes)" if training else "stopped (notes)" if lost else "not run"
            versus = published(ref, row.digits)
            p.line(
                suite, task, label, ours, versus, where, what, row.digits, none=none, made=made(name), stale=stale(name)
            )
        for peer, library in ((row.cleanrl, "CleanRL"), (row.epymarl, "EPyMARL"), (row.jaxmarl, "JaxMARL")):
            if not (kept := peer and store.kept_summary(peer)):
                continue
            metric, steps = (R.TRAIN, kept["steps"]) if library == "CleanRL" else (metric_of(row), None)
            theirs = p.values(peer, f"{algo} ({library})", task, metric, steps, row.agents)
            ours = p.values(name, algo, task, metric, steps, row.agents)
            if steps:
                what = described(metric, steps)
            else:  # each library's last test, where it lands near the budget
                ends = {k(points[-1][0]) for _, rows in seed_runs(peer) if (points := curve(rows, metric))}
                budget, last = k(R.SMAX_STEPS) if row.jaxmarl else qmix, "/".join(sorted(ends))
                what = ("win rate, " if row.jaxmarl else "") + f"final greedy test at {budget} ({library}'s at {last})"
            where = f"{library} `{kept[library.lower() + '_commit'][:7]}` run here"
            versus = runs_here(theirs, row.digits)
            p.line(suite, task, label, ours, versus, where, what, row.digits, made=made(name), stale=stale(name))
        metric, ref = metric_of(row), row.references[0] if row.references else None
        series = [("ddprl", "C0", name, "seed")] + [("ddprl, in training", "C2", name, IN_PROGRESS)] * row.long
        for peer, library in ((row.cleanrl, "CleanRL"), (row.epymarl, "EPyMARL"), (row.jaxmarl, "JaxMARL")):
            series += (
                [(f"{library} run here", "C1", peer, "seed")] if peer and (metric == R.TRAIN or not row.cleanrl) else []
            )
        p.panel(suite, name.split("-", 1)[1], metric, series, row.agents, ref)  # the row's name, its algorithm gone


def peer_tables(p: Page) -> list[str]:
    """The PureJaxRL lines, and its seconds per seed (end to end, then compile and training alone)."""
    times = ["| row | " + " | ".join(R.IMPLS.values()) + " |", "|---" * 5 + "|"]
    for name, row in R.PEER_ROWS.items():
        if not (kept := store.kept_summary(name)):
            p.line(JAX, f"gymnax {row.task}", f"`{name}`", [], Versus("not run", None), "PureJaxRL", "")
            continue
        steps, colours = kept["steps"], {"purejaxrl": "C1", "jax1": "C0", "jax": "C2", "torch": "C3"}
        series = [(R.IMPLS[impl], colours[impl], name, f"{impl}-seed") for impl in row.impls]
        p.panel(JAX, row.task, R.TRAIN, series)
        theirs = p.values(name, "PPO (PureJaxRL)", row.task, R.TRAIN, steps, prefix="purejaxrl-seed")
        for impl in row.ddprl_impls:
            task = row.torch_task if impl == "torch" else row.task
            ours = p.values(name, f"PPO (ddprl {impl})", task, R.TRAIN, steps, prefix=f"{impl}-seed")
            where = f"PureJaxRL `{kept['purejaxrl']['commit'][:7]}` run here, gymnax"
            where += "; ddprl Gymnasium" if impl == "torch" else ""
            label, made_by = f"`{name}` {R.IMPLS[impl]}", made(name, f"{impl}-seed")
            versus, what, changed = runs_here(theirs, 1), described(R.TRAIN, steps), stale(name, f"{impl}-seed")
            p.line(JAX, row.task, label, ours, versus, where, what, made=made_by, stale=changed)
        cells = []  # each's mean seconds per seed: end to end (compile, training)
        for impl in R.IMPLS:
            means = [[s[impl][key] for s in kept["seeds"] if s.get(impl, {}).get(key) is not None] for key in SECONDS]
            cells.append(" / ".join(f"{statistics.mean(m):.1f}" if m else "—" for m in means) if means[0] else "—")
        times.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return times


def supervised_table(p: Page) -> None:
    for name, row in R.SUPERVISED_ROWS.items():
        what = f"test {row.metric}" + (" (lower is better)" if row.metric == "mse" else "")
        ours = p.values(name, "supervised", row.dataset, f"test/{row.metric}", what=what)
        seeds = (store.kept_summary(name) or {"seeds": []})["seeds"]
        for model in seeds[0]["baselines"] if seeds else []:
            for s in seeds:  # fitted when the ddprl seed was kept, on its machine
                made_by = store.provenance_of(name, "seed", s["seed"])
                record = (row.dataset, s["baselines"][model], "", *(made_by[f] or "" for f in PROVENANCE))
                p.csv[(name, model, s["seed"], what)] = record
            versus = runs_here([s["baselines"][model] for s in seeds], 4)
            lower, made_by = row.metric == "mse", made(name)
            changed = stale(name)
            p.line(
                "Supervised",
                row.dataset,
                f"`{name}`",
                ours,
                versus,
                model,
                what,
                4,
                lower=lower,
                made=made_by,
                stale=changed,
            )


def versus(spec: str) -> str:
    """'a+b:c+d': rows a and b pooled against c and d, each measured as its first reference is."""
    parts = [part.split("+") for part in spec.split(":")]
    refs = [[(n, R.ROWS[n].references[0]) for n in part] for part in parts]
    a, b = ([v for n, ref in side for v in Page().values(n, "", "", ref.metric, ref.steps)] for side in refs)
    names = [" + ".join(f"`{n}`" for n in part) for part in parts]
    if min(len(a), len(b)) < 2:
        return ""
    return f"{names[0]} against {names[1]}: {mean_std(a, 1)} against {mean_std(b, 1)}, Welch's p = {welch(a, b):.3f}."


@functools.cache
def attempts(name: str, folder: str) -> list[tuple[str, list[dict]]]:
    """A long row's unfinished runs in ``runs/ROW/<folder>/`` in seed order, each with its metrics at its last
    stop: IN_PROGRESS, its seeds in training; LOST, attempts whose checkpoint went with their machine (the
    second of seed 1 kept as ``seed1-2``). Each labelled ``seed 1`` or ``seed 1, attempt 2``."""
    found = []
    for path in (store.RUNS / name / folder).glob("seed*"):
        seed, _, attempt = path.name.removeprefix("seed").partition("-")
        label = f"seed {seed}" + (f", attempt {attempt}" if attempt else "")
        found.append(((int(seed), int(attempt or 1)), label, store.read_rows(path)))
    return [(label, rows) for _, label, rows in sorted(found, key=lambda entry: entry[0])]


def runs_of(name: str, prefix: str) -> list[tuple]:
    return attempts(name, IN_PROGRESS) if prefix == IN_PROGRESS else seed_runs(name, prefix)


def unfinished(name: str) -> str:
    """How far a long row's seeds in training got at their last stop, and its lost attempts."""
    row = R.ROWS.get(name)
    if row is None or not row.long:
        return ""
    metric, budget = metric_of(row), row.references[0].steps if row.references else None
    what = "training return over its last 5 %" if metric == R.TRAIN else "last evaluation"

    def how_far(label: str, rows: list[dict]) -> str:
        steps, points = rows[-1]["step"], curve(rows, metric)
        value = (window_mean if metric == R.TRAIN else at_steps)(points, steps) if points else None
        of = f" of {k(budget)}" if budget else ""
        return f"{label} at {k(steps)}{of} steps" + (f" ({what} {value:.1f})" if value is not None else "")

    training = [how_far(label, rows) for label, rows in attempts(name, IN_PROGRESS)]
    gone = [how_far(label, rows) for label, rows in attempts(name, LOST)]
    said = [f"In training: {'; '.join(training)}." if training else ""]
    said.append(f"Attempts lost with their machine's checkpoint: {'; '.join(gone)}." if gone else "")
    return " ".join(part for part in said if part)


def notes(section: str, p: Page) -> list[str]:
    out = [f"- {note}" for note in NOTES[section].split("\n")]
    sections = {"ppo": "PPO", "qmix": "QMIX", "tdmpc2": "TD-MPC2", "jax": JAX, "supervised": "Supervised"}
    for name in [*R.ROWS, *R.PEER_ROWS, *R.SUPERVISED_ROWS]:
        if sections[name.split("-")[0]] != section:
            continue
        changed = p.stale.get(name) and "Stale: its kept runs ran keys the row now gives otherwise: " + "; ".join(
            p.stale[name]
        )
        parts = (R.NOTES.get(name, ""), versus(R.VERSUS[name]) if name in R.VERSUS else "", unfinished(name))
        parts += (changed or "",)
        if parts[0] or parts[2] or parts[3]:  # a comparison alone makes no note
            out.append(f"- `{name}`: " + " ".join(part for part in parts if part))
    if section == "QMIX":
        paths = {task: (store.RUNS / row / "random.json", n) for row, (task, n) in R.RANDOM_TASKS.items()}
        kept = {task: (json.loads(path.read_text()), n) for task, (path, n) in paths.items() if path.exists()}
        floors = "; ".join(
            f"{task} {f['mean'] / n:.2f} ± {f['std'] / n:.2f}{battles(f)}" for task, (f, n) in kept.items()
        )
        out.append(f"- Random actions, uniform over the available ones (± std over 400 episodes): {floors}")
    return out


def battles(floor: dict) -> str:
    """The battles random actions won, where the environment reports wins (SMAX)."""
    return f", {floor['won']} of {floor['episodes']} battles won" if "won" in floor else ""


def figure(p: Page, suite: str) -> list[str]:
    """A suite's figure below its table (none while no curve of it is kept)."""
    if suite not in p.panels:
        return []
    path = store.IMAGES / (re.sub(r"[^a-z0-9]+", "-", suite.lower()).strip("-") + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figures.draw_suite(path, f"{suite}: IQM over seeds, 95 % CI shaded", p.panels[suite])
    return [f"![{suite}: curves]({path.relative_to(store.PAGE.parent)})", ""]


def verdict_counts(p: Page) -> list[str]:
    """The top of the page: each suite's comparisons by verdict."""
    lines = [
        "| suite | comparisons | above | within | below | no verdict (a side not run, or one seed) | stale "
        "| P(a ddprl run better than a reference run) [95 % CI], comparisons with per-seed references |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for suite, verdicts in p.verdicts.items():
        counts = [verdicts.count(v) for v in ("above", "within", "below", "—")]
        counts.append(sum(v.endswith(" stale") for v in verdicts))
        ours, theirs = [list(pair.ours) for pair in p.pairs[suite]], [list(pair.theirs) for pair in p.pairs[suite]]
        chance = "—"
        if ours:
            low, high = stats.improvement_interval(ours, theirs)
            chance = f"{stats.improvement(ours, theirs):.2f} [{low:.2f}, {high:.2f}], {len(ours)}"
        lines.append(f"| {suite} | {len(verdicts)} | " + " | ".join(map(str, counts)) + f" | {chance} |")
    return lines


ACROSS_TEXT = (
    "Where a suite's tasks share a scale, its runs pool over tasks: the IQM of every run of every task (each task's "
    "first N seeds, N the fewest any task has, so that tasks weigh alike) with its 95 % stratified-bootstrap "
    "interval, and the performance profile, the share of runs scoring above each point of the scale (rliable's "
    "`create_performance_profile`). MuJoCo's returns map onto D4RL's scale (Fu et al. 2020, arXiv 2004.07219, "
    "`d4rl/infos.py`: 0 its random policy's return, 1 its expert's) for the four tasks D4RL scores; classic "
    "control has no per-seed reference, the JAX engine's tasks no common scale.\n"
)
ACROSS_COLUMNS = (
    "| tasks | scale | ddprl | aggregate IQM [95 % CI] | reference | aggregate IQM [95 % CI] | verdict | seeds |"
)


def pooled(pairs: dict[str, Pair], names: tuple[str, ...], side: str, spec: Across) -> np.ndarray:
    """One side's (``ours`` or ``theirs``) runs of the rows ``names``, runs x tasks on the [0, 1] scale."""
    return spec.normalised(stats.first_seeds([list(getattr(pairs[name], side)) for name in names]), names)


def profile(label: str, colour: str, scores: np.ndarray) -> figures.Profile:
    """The performance profile of ``scores`` (runs x tasks on [0, 1]) at :data:`TAUS`, with its 95 % band."""
    return figures.Profile(
        label, colour, TAUS, stats.score_distribution(scores, TAUS), *stats.profile_band(scores, TAUS)
    )


def across_tasks(p: Page) -> list[str]:
    """Each :data:`ACROSS` suite's runs pooled over its tasks: a line for every configuration, its aggregate IQM
    beside its reference's, and a figure of their performance profiles, a panel a suite."""
    lines, panels = [ACROSS_TEXT, ACROSS_COLUMNS, "|---" * 8 + "|"], []
    for suite, spec in ACROSS.items():
        pairs, profiles, references = {pair.row: pair for pair in p.pairs[suite]}, [], {}
        for (label, names), colour in zip(spec.configurations.items(), ("C0", "C2"), strict=False):
            cells = f"| {spec.tasks} | {spec.scale} | {label} |"
            if any(name not in pairs or len(pairs[name].ours) < 2 for name in names):
                ran = all(len(seed_runs(name)) >= 2 for name in names)  # ddprl's seeds kept: its reference's missing
                lines.append(f"{cells} {'— | | not run' if ran else 'not run | |'} | — | |")
                continue
            ours, theirs = (pooled(pairs, names, side, spec) for side in ("ours", "theirs"))
            (mine, interval), (reference, theirs_interval) = scored(ours, 3), scored(theirs, 3)
            source, verdict = pairs[names[0]].source, stats.verdict(interval, theirs_interval)
            lines.append(f"{cells} {mine} | {source} | {reference} | {verdict} | {len(ours)} / {len(theirs)} a task |")
            who = re.sub(r" `[0-9a-f]+`", "", source)  # "EPyMARL run here": a commit is the table's
            profiles.append(profile(label, colour, ours))
            references.setdefault(who, profile(who, "C1", theirs))  # each reference once a panel, last
        if profiles:
            panels.append((spec.tasks, spec.scale, [*profiles, *references.values()]))
    if panels:
        path = store.IMAGES / "across-tasks.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figures.draw_profiles(path, "Performance profiles over each suite's tasks, 95 % CI shaded", panels)
        lines += ["", f"![Performance profiles]({path.relative_to(store.PAGE.parent)})"]
    return lines


def commands() -> list[str]:
    """The commands table's lines, one a command: rows whose commands differ in their task alone share one, with
    the task written ``<task>`` (each row's task is in its table)."""
    groups: dict[str, list[tuple[str, R.Row]]] = {}  # the command with <task>: its rows
    for name, row in {**R.ROWS, **R.SUPERVISED_ROWS}.items():
        groups.setdefault(re.sub(r"(?<= )task=\S+", "task=<task>", row.command()), []).append((name, row))
    lines = []
    for shared, rows in groups.items():
        if len(rows) == 1:
            lines.append(f"| `{rows[0][0]}` | `{rows[0][1].command()}` |")
        else:
            lines.append("| " + ", ".join(f"`{name}`" for name, _ in rows) + f" | `{shared}` |")
    return lines


def page() -> str:
    """Writes docs/results.csv and a figure per suite in docs/results/, and returns docs/results.md's text."""
    seed_runs.cache_clear()
    attempts.cache_clear()
    p = Page()
    rl_tables(p)
    times = peer_tables(p)
    supervised_table(p)
    text = [HEADER, *verdict_counts(p), "", *map(paragraph, across_tasks(p)), ""]
    for suite, lines in p.tables.items():
        text += [f"## {suite}\n", COLUMNS, "|---" * COLUMNS.count(" | ") + "|---|", *lines, "", *figure(p, suite)]
    section = [
        f"## {RECONSTRUCTION}\n",
        "OMAGD's staged training (docs/qmix.md, \"Staged training\") on `smax/3m` with every unit's sight shortened "
        "from 9 to 6, where 58 % of the units alive are out of an agent's sight in random play (33 % at 9): QMIX on "
        "the sight-limited observation, on it with the unseen nodes filled in by the frozen reconstructer of stages 1 "
        "and 2, and on the full observation (the oracle, the headroom). Same keys and budget otherwise; 32 greedy "
        "test battles every 50k steps. The interval is over seeds (rliable's method, 50,000 replicates); the "
        "verdict says whether it lies above, below or overlaps the sight-limited row's.\n",
        *reconstruction_table(p),
        "",
        *figure(p, RECONSTRUCTION),
        "The stages, run once on 2 ranks (stage 2 with a smaller predictor than OMAGD's: docs/qmix.md):\n",
        "| stage | command |",
        "|---|---|",
        *(f"| `{stage}` | `{command}` |" for stage, command in R.STAGE_COMMANDS.items()),
        "",
    ]
    text += [paragraph(line) for line in section]
    text += ["## Notes\n", *notes("", p), ""]
    for section in NOTES:
        if not section:
            continue
        timing = ["", "Seconds per seed, mean: end to end / compile / training alone.", "", *times]
        text += [f"### {section}\n", *notes(section, p), *(timing if section == JAX else []), ""]
    sources = dict.fromkeys(ref.source for row in R.ROWS.values() for ref in row.references)
    text += ["## References\n", *(f"* {source}" for source in sources), "", "## Commands\n"]  # * : not wrapped
    text += [
        paragraph(
            f"`{RUN} ROW --seeds 3` reruns a row; `{RUN} --list` prints every row's command (below, `<task>` is the "
            "row's task in its table). The peer libraries run from checkouts and environments of their own: "
            f"`{RUN} ROW --purejaxrl DIR --purejaxrl-python PY` (likewise `--cleanrl`, `--epymarl`, `--jaxmarl`); "
            "rows.py's `*_CLONE` and `*_VENV` make them (EPyMARL's: qmix_speed.py)."
        ),
        "\n| row | command |\n|---|---|",
        *commands(),
    ]
    out, header = io.StringIO(), [("row", "algorithm", "task", "seed", "metric", "value", "steps_reached", *PROVENANCE)]
    records = [(n, a, t, s, w, repr(v), *more) for (n, a, s, w), (t, v, *more) in p.csv.items()]
    csv.writer(out, lineterminator="\n").writerows(header + records)
    store.PAGE.with_suffix(".csv").write_text(out.getvalue())
    wrap = dict(width=100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)  # prose bullets
    lines = "\n".join(text).split("\n")
    return "\n".join(w for x in lines for w in ([x] if x[:2] != "- " else textwrap.wrap(x[2:], **wrap))) + "\n"
