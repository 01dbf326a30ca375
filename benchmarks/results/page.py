"""docs/results.md, docs/results.csv and docs/results/curves.png, built only from the runs kept under ``runs/``:
every ddprl number is computed here from the kept metrics, every reference is a cited value of rows.py or
computed from a peer library's runs kept beside ddprl's."""

from __future__ import annotations

import csv
import functools
import io
import json
import statistics
import textwrap

from . import rows as R
from . import stats, store
from .store import at_steps, curve, gap, mean_std, welch, window_mean
from .training import IN_PROGRESS, LOST

RUN = "python benchmarks/results/run.py"
HEADER = f"""# Results: published numbers, reproduced

ddprl, one run per seed, beside published numbers and peer libraries run on the same machine; each ± says
what it is over, and gap = (ddprl mean - reference) / the reference's ±. Per-seed values: [results.csv](results.csv);
`{RUN} --page` rebuilds page, CSV and figure from `benchmarks/results/runs/`.
"""
COLUMNS = "| row | ddprl | reference | source, task version | metric | ± over | gap (ref. std) | seeds |"
JAX = "The JAX engine against PureJaxRL, on the same CPU"
LEGEND = "here orange (CleanRL, EPyMARL, PureJaxRL); the published reference dashed, with its ± shaded.\n"
SECONDS = ("wall_s", "compile_s", "train_s")
NOTES = {
    "": "A published reference's ± is what its source reports. Runs made before ddprl hashed evaluation seeds shared "
    "all but one evaluation environment between consecutive seeds (every row but `ppo-ant`, the Humanoid rows, "
    "reacher-easy seed 3, finger-spin seeds 2-3 and the bootstrap row's seeds 2-3): their std is over largely the "
    "same episodes.",
    "PPO": "The SB3 zoo's numbers are one agent's evaluation episodes on older task versions; CleanRL's the "
    "training episodes' return at 1M steps over 3 seeds, on v4 tasks.",
    "QMIX": "Reference: EPyMARL's QMIX run here on the same task and protocol (100 greedy test episodes every 50k), "
    "Papoudakis et al. 2021 (arXiv 2006.07869) Table 3 not being transcribed (no copy was reachable). `-epymarl` "
    "rows run EPyMARL's QMIX settings (raw mixer states, unbootstrapped time limits, 32 episodes an update).\n"
    "simple_spread: returns per agent (team return / 3), as Papoudakis et al. report; EPyMARL steps PettingZoo "
    "1.24.3's simple_spread_v3, whose wrapper reports 0 for an episode's 25th step.\n"
    "SMAX rows: the share of greedy test battles won (32 a test), against JaxMARL's QMIX run here "
    f"({R.JAXMARL_REPO} `baselines/QLearning/qmix_rnn.py` with its `ql_rnn_smax` configuration) on the same battle "
    "and budget; JaxMARL's own runs of that configuration go to 10M steps, and its published SMAX curves are not "
    "transcribed here.",
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


def reference(values: list[float], digits: int) -> tuple:
    """Another library's runs kept here as a reference: (its cell, mean, std, what its ± is over)."""
    std = statistics.stdev(values) if len(values) > 1 else None
    return mean_std(values, digits), statistics.mean(values), std, f"std over {len(values)} seeds"


class Page:
    """The tables' lines, the CSV's records and the figure's panels, built row by row."""

    def __init__(self) -> None:
        self.csv: dict[tuple, tuple] = {}
        self.panels: list[tuple] = []

    def values(self, name, algo, task, metric, steps=None, agents=1, prefix="seed", what=None) -> list[float]:
        """Each kept seed's ``metric`` at ``steps`` (TRAIN: the mean over the last 5 %; no steps: its last value)
        divided by ``agents``, recorded for the CSV."""
        out = []
        for seed, rows in seed_runs(name, prefix):
            points = curve(rows, metric)
            value = points[-1][1] if steps is None else (window_mean if metric == R.TRAIN else at_steps)(points, steps)
            if value is not None:
                key, value = (name, algo, seed, what or described(metric, steps)), value / agents
                self.csv[key] = (task, value, rows[-1]["step"])
                out.append(value)
        return out

    def line(self, label, ours, ref: tuple, source: str, metric: str, digits: int = 1, none="not run") -> str:
        """A table line; ``none``: ddprl's cell when no seed is kept."""
        cell, value, std, spread = ref
        n = len(ours)
        over = "—" if not n else f"std over {n} seeds, both" if spread == f"std over {n} seeds" else None
        over = over or f"ddprl std over {n} seeds; ref. {spread}"
        ddprl = mean_std(ours, digits) if ours else none
        cells = [label, ddprl, cell, source, metric, over, gap(ours, value, std), str(n)]
        return "| " + " | ".join(cells) + " |"

    def panel(self, title, metric, series, agents=1, ref=None) -> None:
        """A figure panel: for each (colour, row, prefix) of ``series``, each kept seed's curve of ``metric``
        (prefix IN_PROGRESS: each seed's in training)."""
        curves = [(c, curve(rows, metric)) for c, name, prefix in series for _, rows in runs_of(name, prefix)]
        curves = [(c, [(s, v / agents) for s, v in points]) for c, points in curves if points]
        if curves:
            self.panels.append((title, metric, curves, ref))


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
        p.panel(name, R.WON, [("C0", name, "seed")])
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


def rl_tables(p: Page) -> dict[str, list[str]]:
    tables: dict[str, list[str]] = {"PPO": [], "QMIX": [], "TD-MPC2": []}
    qmix = k(R.QMIX_STEPS)
    for name, row in R.ROWS.items():
        if name in R.RECONSTRUCTION_ROWS:  # a table of their own
            continue
        algo, task = {"qmix": "QMIX", "tdmpc2": "TD-MPC2"}.get(row.key("algo"), "PPO"), row.key("task")
        for ref in row.references:
            where = f"{ref.who}, {ref.task}" + ("" if ref.task == task else f"; ddprl {task}")
            what = described(ref.metric, ref.steps) + (" agent steps" if algo == "TD-MPC2" else "")
            ours = p.values(name, algo, task, ref.metric, ref.steps, what=what)
            cell = f"{ref.value!r} ± {ref.std!r}"
            training, lost = attempts(name, IN_PROGRESS), attempts(name, LOST)
            none = "in training (notes)" if training else "stopped (notes)" if lost else "not run"
            ref_cells = (cell, ref.value, ref.std, ref.spread)
            tables[algo].append(p.line(f"`{name}`", ours, ref_cells, where, what, none=none))
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
            where = f"{library} `{kept[library.lower() + '_commit'][:7]}` run here, {task}"
            tables[algo].append(p.line(f"`{name}`", ours, reference(theirs, row.digits), where, what, row.digits))
        metric = metric_of(row)
        peers = (row.cleanrl, row.epymarl, row.jaxmarl)
        series = [("C0", name, "seed")] + [("C0", name, IN_PROGRESS)] * row.long
        series += [("C1", peer, "seed") for peer in peers if peer]
        ref = (row.references[0].value, row.references[0].std) if row.references else None
        p.panel(name, metric, series if metric == R.TRAIN or not row.cleanrl else series[:1], row.agents, ref)
    return tables


def peer_tables(p: Page) -> tuple[list[str], list[str]]:
    """The PureJaxRL table, and its seconds per seed (end to end, then compile and training alone)."""
    lines, times = [], ["| row | " + " | ".join(R.IMPLS.values()) + " |", "|---" * 5 + "|"]
    for name, row in R.PEER_ROWS.items():
        if not (kept := store.kept_summary(name)):
            lines.append(f"| `{name}` | not run | | | | | | 0 |")
            continue
        steps, colours = kept["steps"], {"purejaxrl": "C1", "jax1": "C0", "jax": "C2", "torch": "C3"}
        ref = reference(p.values(name, "PPO (PureJaxRL)", row.task, R.TRAIN, steps, prefix="purejaxrl-seed"), 1)
        for impl in row.ddprl_impls:
            task = row.torch_task if impl == "torch" else row.task
            ours = p.values(name, f"PPO (ddprl {impl})", task, R.TRAIN, steps, prefix=f"{impl}-seed")
            where = f"PureJaxRL `{kept['purejaxrl']['commit'][:7]}` run here, gymnax {row.task}"
            where += "; ddprl Gymnasium" if impl == "torch" else ""
            lines.append(p.line(f"`{name}` {R.IMPLS[impl]}", ours, ref, where, described(R.TRAIN, steps)))
        cells = []  # each's mean seconds per seed: end to end (compile, training)
        for impl in R.IMPLS:
            means = [[s[impl][key] for s in kept["seeds"] if s.get(impl, {}).get(key) is not None] for key in SECONDS]
            cells.append(" / ".join(f"{statistics.mean(m):.1f}" if m else "—" for m in means) if means[0] else "—")
        times.append(f"| `{name}` | " + " | ".join(cells) + " |")
        p.panel(name, R.TRAIN, [(colours[impl], name, f"{impl}-seed") for impl in row.impls])
    return lines, times


def supervised_table(p: Page) -> list[str]:
    lines = []
    for name, row in R.SUPERVISED_ROWS.items():
        what = f"test {row.metric}" + (" (lower is better)" if row.metric == "mse" else "")
        ours = p.values(name, "supervised", row.dataset, f"test/{row.metric}", what=what)
        seeds = (store.kept_summary(name) or {"seeds": []})["seeds"]
        for model in seeds[0]["baselines"] if seeds else []:
            p.csv.update({(name, model, s["seed"], what): (row.dataset, s["baselines"][model], "") for s in seeds})
            ref = reference([s["baselines"][model] for s in seeds], 4)
            lines.append(p.line(f"`{name}`", ours, ref, f"{model}, same split", what, 4))
    return lines


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


def notes(section: str) -> list[str]:
    out = [f"- {note}" for note in NOTES[section].split("\n")]
    sections = {"ppo": "PPO", "qmix": "QMIX", "tdmpc2": "TD-MPC2", "jax": JAX}
    for name in [*R.ROWS, *R.PEER_ROWS]:
        if sections[name.split("-")[0]] != section:
            continue
        parts = (R.NOTES.get(name, ""), versus(R.VERSUS[name]) if name in R.VERSUS else "", unfinished(name))
        if parts[0] or parts[2]:  # a comparison alone makes no note
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


def draw(panels: list, path) -> None:
    """All rows' curves in one figure: each kept seed's (training returns in 50 bins), the published reference
    dashed with its ± band."""
    from matplotlib.figure import Figure

    cols, rows = 6, -(-len(panels) // 6)
    fig = Figure(figsize=(cols * 2.6, rows * 2.1))
    for i, (title, metric, curves, ref) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for colour, points in curves:
            if metric == R.TRAIN:  # the mean of each 2 % of the steps: one iteration's few episodes are noisy
                bins: dict[int, list[float]] = {}
                for step, value in points:
                    bins.setdefault(int((step - 1) // (points[-1][0] / 50)), []).append(value)
                points = [((b + 0.5) * points[-1][0] / 50, statistics.mean(v)) for b, v in sorted(bins.items())]
            ax.plot([s / 1e6 for s, _ in points], [v for _, v in points], color=colour, linewidth=0.7, alpha=0.8)
        if ref:
            ax.axhline(ref[0], color="k", linestyle="--", linewidth=0.8)
            ax.axhspan(ref[0] - (ref[1] or 0), ref[0] + (ref[1] or 0), color="k", alpha=0.08, linewidth=0)
        ax.set_title(f"{title} ({'train' if metric == R.TRAIN else 'eval'})", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.supxlabel("millions of steps (TD-MPC2: agent steps); each line one seed", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=64)


def page() -> str:
    """Writes docs/results.csv and docs/results/curves.png, and returns docs/results.md's text."""
    seed_runs.cache_clear()
    attempts.cache_clear()
    p = Page()
    tables = rl_tables(p)
    tables[JAX], times = peer_tables(p)
    tables["Supervised"] = supervised_table(p)
    text = [
        HEADER,
        *(f"## {name}\n\n{COLUMNS}\n|{'---|' * 8}\n" + "\n".join(rows) + "\n" for name, rows in tables.items()),
    ]
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
        "The stages, run once on 2 ranks (stage 2 with a smaller predictor than OMAGD's: docs/qmix.md):\n",
        "| stage | command |",
        "|---|---|",
        *(f"| `{stage}` | `{command}` |" for stage, command in R.STAGE_COMMANDS.items()),
        "",
    ]
    text += [paragraph(line) for line in section]
    if p.panels:  # no kept curve (a new store): no figure
        store.IMAGES.mkdir(parents=True, exist_ok=True)
        draw(p.panels, store.IMAGES / "curves.png")
        image = (store.IMAGES / "curves.png").relative_to(store.PAGE.parent)
        text += ["## Curves\n", f"![Every row's curves: each seed, and the reference with its ±]({image})\n"]
        text += [
            f"Each line one seed: ddprl blue (`jax-*`: jax, 1 device; green 2 devices, red torch), the library run "
            f"{LEGEND}"
        ]
    text += ["## Notes\n", *notes(""), ""]
    for section in tables:
        timing = ["", "Seconds per seed, mean: end to end / compile / training alone.", "", *times]
        text += [f"### {section}\n", *notes(section), *(timing if section == JAX else []), ""]
    sources = dict.fromkeys(ref.source for row in R.ROWS.values() for ref in row.references)
    text += ["## References\n", *(f"- {source}" for source in sources), "", "## Commands\n"]
    text += [
        f"`{RUN} ROW --seeds 3` reruns a row; `{RUN} --list` prints every row's command. The peer libraries run "
        f"from checkouts and environments of their own: `{RUN} ROW --purejaxrl DIR --purejaxrl-python PY` "
        "(likewise `--cleanrl`, `--epymarl`, `--jaxmarl`); rows.py's `*_CLONE` and `*_VENV` make them (EPyMARL's: "
        "qmix_speed.py).",
        "\n| row | command |\n|---|---|",
        *(f"| `{name}` | `{row.command()}` |" for name, row in {**R.ROWS, **R.SUPERVISED_ROWS}.items()),
    ]
    out, header = io.StringIO(), [("row", "algorithm", "task", "seed", "metric", "value", "steps_reached")]
    records = [(n, a, t, s, w, repr(v), x) for (n, a, s, w), (t, v, x) in p.csv.items()]
    csv.writer(out, lineterminator="\n").writerows(header + records)
    store.PAGE.with_suffix(".csv").write_text(out.getvalue())
    wrap = dict(width=100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False)  # prose bullets
    lines = "\n".join(text).split("\n")
    return "\n".join(w for x in lines for w in ([x] if x[:2] != "- " else textwrap.wrap(x[2:], **wrap))) + "\n"
