"""docs/results.md and its PNGs, built only from the runs kept under ``runs/`` (so the page's numbers
are the ones the runs printed): the main table, the QMIX and TD-MPC2 status, the PureJaxRL table,
the supervised table, and each row's details and curve."""

from __future__ import annotations

import json
import re
import statistics
import textwrap
from pathlib import Path

from . import store
from .peers import RANDOM_EPISODES
from .rows import (
    DDPRL_IMPLS,
    EVAL,
    IMPLS,
    METRIC_NAMES,
    PEER_DEVICES,
    PEER_NOTES,
    PEER_ROWS,
    PUREJAXRL_CLONE,
    PUREJAXRL_COMMIT,
    PUREJAXRL_REPO,
    PUREJAXRL_VENV,
    QMIX_SEEDS,
    QMIX_TASKS,
    ROWS,
    SUPERVISED_ROWS,
    TDMPC2_TASKS,
    TRAIN,
    PeerRow,
    Reference,
    Row,
    ddprl_ppo_keys,
    epymarl_row,
)
from .stats import across_seeds, binned_mean, curve, papoudakis_returns, per_agent, window_mean
from .store import (
    IN_PROGRESS,
    LOST,
    in_progress,
    kept_seeds,
    kept_summary,
    read_rows,
    seed_curves,
    seed_machine,
    seed_of,
)


def kept_random(row: str) -> tuple[str, dict] | None:
    """The random-action floor of a QMIX row's task (``--random``), kept in the folder of the
    task's row in QMIX_TASKS, and that row's name."""
    task_row = next((name for name in QMIX_TASKS if row.startswith(name)), None)
    if task_row is None or not (store.RUNS / task_row / "random.json").exists():
        return None
    return task_row, json.loads((store.RUNS / task_row / "random.json").read_text())


def against_epymarl(row: str) -> str:
    """A QMIX row's mean final test set against EPyMARL's run here on its task: within one of
    EPyMARL's standard deviations of its mean, above that, or how many of them below, with Welch's
    t-test of the two means there (how likely seed noise alone leaves a gap that size); nothing
    until each has 2 seeds (no standard deviation)."""
    from scipy.stats import ttest_ind

    ours, ref = kept_summary(row), epymarl_runs(ROWS[row])
    if not ours or not ref or len(ours["seeds"]) < 2 or len(ref["summary"]["seeds"]) < 2:
        return ""
    finals, ref_finals = ([s["final"] for s in kept["seeds"]] for kept in (ours, ref["summary"]))
    mean, ref_mean, ref_std = statistics.mean(finals), statistics.mean(ref_finals), statistics.stdev(ref_finals)
    if mean > ref_mean + ref_std:
        return ", above EPyMARL's by more than one std"
    if mean >= ref_mean - ref_std:
        return ", within one std of EPyMARL's"
    p = ttest_ind(finals, ref_finals, equal_var=False).pvalue
    below = f"{(ref_mean - mean) / ref_std:.2f} std below" if ref_std else "below"
    # The final test is one evaluation of each seed; Papoudakis et al.'s maximum returns (the
    # best evaluation of the mean curve) are what the paper ranks algorithms by.
    ours_max, ref_max = papoudakis_returns(seed_curves(row, ours)), papoudakis_returns(ref["curves"])
    inside = abs(ours_max["max_mean"] - ref_max["max_mean"]) <= ref_max["max_ci95"]
    return (
        f", {below} EPyMARL's (Welch's t-test p = {p:.2f}); its maximum returns "
        f"{'inside' if inside else 'outside'} EPyMARL's 95 % confidence interval"
    )


def qmix_seeds() -> list[str]:
    """Each QMIX task's seeds kept so far, counted from the rows' summaries (what is left to run
    is what this table lacks), with ddprl's mean final test against EPyMARL's."""
    lines = [
        "",
        "| task | ddprl's defaults | ddprl, EPyMARL's settings | EPyMARL run here | random actions |",
        "|---|---|---|---|---|",
    ]

    def seeds(row: str) -> str:
        kept = kept_summary(row)
        return f"{len(kept['seeds']) if kept else 0} of {QMIX_SEEDS}"

    for name, (task, agents) in QMIX_TASKS.items():
        cells = [seeds(row) + against_epymarl(row) for row in (name, name + "-epymarl")]
        cells.append(seeds(epymarl_row(name)))
        floor = kept_random(name)
        cells.append("not measured" if floor is None else f"{floor[1]['mean'] / agents:.2f}")
        lines.append(f"| {task} | {' | '.join(cells)} |")
    return lines + [""]


def rware_finals() -> str:
    """Random actions' return on rware-tiny against the best final test of any QMIX run kept there,
    ddprl's or EPyMARL's."""
    name = "qmix-rware-tiny-2ag"
    floor = kept_random(name)
    floor_text = "not measured yet" if floor is None else f"make {floor[1]['mean']:.2f} (`run.py {name} --random`)"
    kept = [kept_summary(row) for row in (name, name + "-epymarl", epymarl_row(name))]
    finals = [seed["final"] for summary in kept if summary for seed in summary["seeds"]]
    best = f"the highest final test of their {len(finals)} runs is {max(finals):.2f}" if finals else "no run yet"
    return f"random actions {floor_text}, and {best}"


def bootstrap_divergence() -> str:
    """How QMIX diverged on simple_spread with time limits bootstrapped, read from the row's kept
    seeds: the mean Q of the taken actions at 110k and 1.2M steps, the greedy return per agent at the
    first test and the last."""
    name = "qmix-mpe-simple-spread-bootstrap"
    if not (summary := kept_summary(name)):
        return "not run yet"
    agents = ROWS[name].agents
    q_at: dict[int, list[float]] = {110_000: [], 1_200_000: []}
    first, last = [], []
    for seed in summary["seeds"]:
        rows = store.read_rows(store.RUNS / name / f"seed{seed['seed']}")
        q = {r["step"]: r["train/q_taken_mean"] for r in rows if "train/q_taken_mean" in r}
        for step, values in q_at.items():
            values.append(q[step])
        tests = curve(rows)
        first.append(tests[0][1] / agents)
        last.append(tests[-1][1] / agents)

    def span(values: list[float]) -> str:
        low, high = f"{min(values):,.0f}", f"{max(values):,.0f}"
        return low if low == high else f"{low} to {high}"

    seeds = len(summary["seeds"])
    counted = "its one seed" if seeds == 1 else f"{seeds} seeds"
    return (
        f"mean Q {span(q_at[110_000])} at 110k, {span(q_at[1_200_000])} at 1.2M; the greedy return per agent "
        f"{span(first)} at the first test, {span(last)} at the last; {counted}"
    )


def random_line(name: str, agents: int, digits: int) -> list[str]:
    """A QMIX row's detail line for the random-action floor of its task, where it is kept."""
    if (floor := kept_random(name)) is None:
        return []
    base, kept = floor
    return [
        f"- random actions (`python benchmarks/results/run.py {base} --random`): {kept['mean'] / agents:.{digits}f} "
        f"± {kept['std'] / agents:.{digits}f} over {kept['episodes']} episodes, {kept['positive']} of them with a "
        "return above 0 (uniform over each agent's available actions, ddprl's environment)"
    ]


def not_yet() -> list[str]:
    """The page's 'not reproduced yet': what is missing, with the QMIX seeds counted from the runs kept."""
    qmix_missing = (
        "QMIX on EPyMARL's protocol (2M environment steps, 100 greedy test episodes every 50k): ddprl's defaults "
        "and EPyMARL's settings on five tasks are rows above. Papoudakis et al. 2021 (arXiv 2006.07869) Table 3 "
        "is not transcribed: no copy of the table was reachable from the machines these pages were made on. The "
        "reference that stands in for it is EPyMARL itself, run here on the same task and protocol (`run.py "
        "epymarl-<task>`, also on simple_spread, through PettingZoo 1.24.3). The table below counts the seeds "
        f"kept of each, of the {QMIX_SEEDS} each is to have (`--resume` adds the others), and sets ddprl's mean "
        "final test against EPyMARL's, in EPyMARL's standard deviations, where each has 2 seeds or more; where "
        "ddprl's is more than one below, Welch's t-test of the two means: p is the chance that seeds alone, the "
        "means being equal, part them that far (with 3 seeds a side, EPyMARL's standard deviation is itself a "
        "rough estimate) and whether ddprl's maximum returns fall inside EPyMARL's 95 % confidence interval. "
        "On Foraging-2s-8x8-2p-2f-coop-v3 both ddprl rows end below EPyMARL on the final test (0.55 ± 0.11 "
        "and 0.49 ± 0.22 against 0.67 ± 0.06): one seed of each drops at its last test (to 0.43 and 0.24, "
        "from bests of 0.66 and 0.56) while the curves follow EPyMARL's mean throughout (their PNGs); on the "
        "paper's own measure, maximum returns, both fall inside EPyMARL's confidence interval (0.63 and 0.65 "
        "against 0.69 ± 0.11), and over each seed's last five tests the gap is 1.1 and 1.2 of EPyMARL's "
        "standard deviations (Welch's p 0.18 and 0.43). On Foraging-8x8-2p-2f-coop-v3 the two ddprl rows "
        "trade places between the final test (defaults within one std, EPyMARL's settings 1.01 below) and "
        "the last five tests (1.42 and 0.73 below). Three seeds a side do not resolve gaps this size; the "
        "paper's five would narrow them. Its last column is the team return of uniformly random actions "
        f"({RANDOM_EPISODES} episodes, `run.py ROW --random`; per agent on simple_spread), the floor a policy has "
        "to clear. On Foraging-10x10-3p-3f-v3 neither EPyMARL nor ddprl learns much in 2M steps: both end near "
        "their first tests, below random actions (the row above and its task note). On simple_spread QMIX with "
        f"time limits bootstrapped diverged (the row 'time limits bootstrapped': {bootstrap_divergence()}): "
        "ddprl's task preset for the cooperative MPE tasks now treats their time "
        "limit as terminal, as EPyMARL does (docs/qmix.md, 'Time limits on MPE'). On rware-tiny-2ag-v2, which "
        "pays only for delivering a requested shelf, neither library's greedy policy learns to deliver in 2.05M "
        f"steps: {rware_finals()}. A ddprl seed took 9 to 22 min alone on the 2-core Intel machine, 16 to 40 "
        "beside other jobs, 23 to 38 min on the AMD one; an EPyMARL seed 96 min (LBF 8x8, three of them and a "
        "ddprl run sharing the Intel machine's 2 cores), 71 min (2s-8x8, three of them alone), 84 to 87 min (10x10, "
        "two of them and a ddprl run, or one beside another EPyMARL run and a TD-MPC2 run), 53 to 59 min "
        "(simple_spread, one of them and a ddprl run; 92 min beside another EPyMARL run and a TD-MPC2 run) and "
        "85 to 98 min (rware-tiny: 90 beside a ddprl run; 98 and 85 beside two TD-MPC2 runs and the test suite)."
    )
    csv = ", ".join(f"{task} {' / '.join(f'{v:g}' for v in values)}" for task, values in TDMPC2_TASKS.items())

    # TD-MPC2 seeds kept of 3, (task, count) per row: the CPU rows apart from the GPU ones
    tdmpc2_kept: dict[bool, list[tuple[str, int]]] = {False: [], True: []}
    for name, row in ROWS.items():
        if row.key("algo") == "tdmpc2":
            kept = len(kept_seeds(store.RUNS / name, name, row.command(), 3))
            tdmpc2_kept[row.key("device") == "cuda"].append((row.key("task"), kept))
    cpu_short, gpu_short = (any(kept < 3 for _, kept in tdmpc2_kept[gpu]) for gpu in (False, True))

    def seeds_kept(on_gpu: bool) -> str:
        return ", ".join(f"{task} {kept}" for task, kept in tdmpc2_kept[on_gpu])

    tdmpc2_cpu = (
        "at model_size 1 this "
        "CPU made 2.1 to 2.5 agent steps per second on a core (2.1 each with two seeds side by side), 6 to 7 "
        "hours per seed, and 2.4 each since Mish is computed the faster way (cartpole-swingup's seeds 1 and 2, "
        "their first 22k steps before it, took 6.8 h each, evaluations included); an AMD EPYC of the first Zen "
        "generation made a third of that (0.74 each; 0.80 to 0.91 since Mish is computed from one exp), so each of the "
        "three CPU rows trains across many sittings, a seed a core, each seed going on from its checkpoint and "
        "replay buffer (`run.py tdmpc2-TASK --seeds 3 --jobs 2 --resume`; a row above says how far each seed "
        "got, and how far an attempt got before its checkpoints went with the machine they were on): seeds "
        f"kept so far of 3, {seeds_kept(False)}."
        if cpu_short
        else "the three CPU rows (model_size 1) have their 3 seeds, each trained across sittings from its "
        "checkpoint and replay buffer (6 to 7 h a seed on a core of the Intel Xeon, up to three times that on "
        "the AMD EPYC: the rows' wall times)."
    )
    tdmpc2_missing = (
        "TD-MPC2 at 100k environment steps (50k agent steps, action repeat 2) against the official per-task CSVs "
        f"(github.com/nicklashansen/tdmpc2, `results/tdmpc2/`, 3 seeds, at 100k: {csv}): {tdmpc2_cpu} "
        "On a GPU the CSVs' own model trains a seed in 9 to 11 min "
        "(the rows 'model_size 5, one GPU'), but a session gets 15 min of a GPU when it gets one at all, about "
        f"one seed: seeds kept so far of 3, {seeds_kept(True)}. docs/benchmarks.md has a 30k-step "
        "cartpole-swingup run on 2 ranks."
    )
    ppo_short = {
        name: kept
        for name, row in ROWS.items()
        if name.startswith("ppo-") and (kept := len(kept_seeds(store.RUNS / name, name, row.command(), 3))) < 3
    }
    ppo_missing = (
        "PPO rows with fewer than 3 seeds kept: "
        + ", ".join(f"`{name}` {kept}" for name, kept in ppo_short.items())
        + " (`run.py ROW --seeds 3 --resume` adds the others). 1M MuJoCo steps with CleanRL's minibatch on 2 "
        "ranks take 20 to 25 min per seed on the 2-core machine these pages are made on when it is otherwise "
        "idle (Ant's 18 min beside one TD-MPC2 seed, run at a lower priority), 36 to 50 min beside heavier jobs."
    )

    return [
        "",
        "## Not reproduced yet",
        "",
        *([f"- {ppo_missing}"] if ppo_short else []),
        f"- {qmix_missing}",
        *qmix_seeds(),
        *([f"- {tdmpc2_missing}"] if cpu_short or gpu_short else []),
    ]


def mean_std(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (1 seed)"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def draw(name: str, row: Row, peer: dict | None = None, cleanrl: dict | None = None) -> Path:
    """Every seed's curves (``ddprl.plot``): the evaluation return, and the training episodes' return
    where a reference is measured on it, each reference drawn as a line and band on its metric;
    EPyMARL's runs here (``peer``: :func:`epymarl_runs`) and CleanRL's (:func:`cleanrl_runs`) as the
    mean ± std over their seeds, black and dashed."""
    from ddprl.plot import figure, load_runs

    runs = load_runs(sorted((store.RUNS / name).glob("seed*")))
    partial = load_runs(sorted((store.RUNS / name / IN_PROGRESS).glob("seed*")))
    runs.update({f"{label}, in progress": records for label, records in partial.items()})
    lost = {
        f"{label}, lost": records
        for label, records in load_runs(sorted((store.RUNS / name / LOST).glob("seed*"))).items()
    }
    # A lost attempt dashed, in the colour of its seed's run where there is one: two attempts of one
    # seed train alike up to the lost one's first resume (a resumed DMC run starts new episodes from
    # other seeds, docs/distributed.md), and the lines lie on each other that far.
    colour = {seed_of(label): f"C{i}" for i, label in enumerate(runs)}
    styles = {
        label: {"linestyle": "--", **({"color": colour[seed_of(label)]} if seed_of(label) in colour else {})}
        for label in lost
    }
    runs.update(lost)
    metrics = [EVAL] + ([TRAIN] if cleanrl or any(ref.metric == TRAIN for ref in row.references) else [])
    fig = figure(runs, metrics, styles=styles)
    lines: dict[str, list] = {metric: [] for metric in metrics}
    for i, ref in enumerate(row.references):
        ax = fig.axes[metrics.index(ref.metric)]
        colour = f"C{len(runs) + i}"
        label = f"{ref.source.split(' ')[0]} ({ref.steps:,} steps)"
        lines[ref.metric].append(ax.axhline(ref.value, color=colour, linestyle="--", linewidth=1, label=label))
        if ref.std:
            ax.axhspan(ref.value - ref.std, ref.value + ref.std, color=colour, alpha=0.1, linewidth=0)
        ax.axvline(ref.steps, color=colour, linestyle=":", linewidth=1)
    if peer:  # EPyMARL run here (epymarl_runs): its tests, every seed on the same grid
        at = across_seeds(peer["curves"])
        lines[EVAL].append(mean_band(fig.axes[0], at, f"EPyMARL here ({seeds_label(len(peer['curves']))})"))
    if cleanrl:  # CleanRL run here (cleanrl_runs): its episodes end at steps of their own, so each seed is binned
        ax = fig.axes[metrics.index(TRAIN)]
        label = f"CleanRL here ({seeds_label(len(cleanrl['runs']))})"
        lines[TRAIN].append(mean_band(ax, cleanrl_bins(cleanrl), label))
    for ax, metric in zip(fig.axes, metrics, strict=True):
        if lines[metric]:
            ax.legend(handles=lines[metric], loc="lower right", fontsize=8)  # the seeds: the figure's legend
        ax.set_title(wrap_title(f"{row.title}: {METRIC_NAMES[metric]}"), fontsize=10)
    store.IMAGES.mkdir(parents=True, exist_ok=True)
    path = store.IMAGES / f"{name}.png"
    fig.savefig(path, dpi=90)
    return path


def seeds_label(n: int) -> str:
    return f"{n} seed{'s' if n > 1 else ''}"


def mean_band(ax, at: dict[float, list[float]], label: str):
    """A peer's runs on a row's figure: the mean over its seeds at each step of ``at`` (``{step:
    each seed's value}``), black and dashed, ± their std as a grey band (2 seeds or more)."""
    steps = list(at)
    mean = [statistics.mean(at[step]) for step in steps]
    (line,) = ax.plot(steps, mean, color="k", linestyle="--", linewidth=1, label=label)
    if steps and len(at[steps[0]]) > 1:
        std = [statistics.stdev(at[step]) for step in steps]
        low = [m - sd for m, sd in zip(mean, std, strict=True)]
        high = [m + sd for m, sd in zip(mean, std, strict=True)]
        ax.fill_between(steps, low, high, color="k", alpha=0.08, linewidth=0)
    return line


def cleanrl_bins(cleanrl: dict) -> dict[float, list[float]]:
    """CleanRL's training episodes (:func:`cleanrl_runs`) on a common grid: each seed's mean return
    in each 2 %-of-the-steps bin (20k steps of 1M), ``{bin centre: each seed's}``, for the bins every
    seed has an episode in."""
    width = cleanrl["summary"]["steps"] / 50
    per_seed = [binned_mean(records, TRAIN, width) for records in cleanrl["runs"]]
    common = sorted(set.intersection(*(set(bins) for bins in per_seed)))
    return {(b + 0.5) * width: [bins[b] for bins in per_seed] for b in common}


def wrap_title(title: str) -> str:
    """A figure's title in lines that fit its width (one line ran past both edges and was cut)."""
    return "\n".join(textwrap.wrap(title, 50))


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def ref_cell(ref: Reference) -> str:
    """A reference's number on the page: value ± its source's std, and what it is measured on."""
    return f"{ref.value:g}{f' ± {ref.std:g}' if ref.std is not None else ''}{on(ref)}"


def on(ref: Reference) -> str:
    """The page's marker for a reference not measured on the evaluation return."""
    return "" if ref.metric == EVAL else " (training episodes)"


def epymarl_runs(row: Row) -> dict | None:
    """The row's EPyMARL runs made here (``row.epymarl``): its summary and each seed's test curve."""
    summary = kept_summary(row.epymarl) if row.epymarl else None
    if summary is None:
        return None
    return {"summary": summary, "curves": seed_curves(row.epymarl, summary)}


def by_machine(summary: dict) -> dict[str, list[dict]]:
    """A row's seeds grouped by the machine each ran on (rows resumed on another machine)."""
    groups: dict[str, list[dict]] = {}
    for seed in summary["seeds"]:
        groups.setdefault(seed_machine(seed, summary), []).append(seed)
    return groups


def wall_per_seed(summary: dict, name_machine: bool = False) -> str:
    """The mean wall time per seed, on each machine apart when the seeds ran on several, and with
    its machine's name where ``name_machine`` (a GPU row's: the CPU rows' machine is the page's)."""
    groups = by_machine(summary)
    walls = {machine: statistics.mean(s["wall_s"] for s in seeds) / 60 for machine, seeds in groups.items()}
    if len(walls) == 1:
        machine, wall = next(iter(walls.items()))
        return f"{wall:.1f} min" + (f" ({short_machine(machine)})" if name_machine else "")
    return "; ".join(f"{wall:.1f} min ({short_machine(machine)})" for machine, wall in walls.items())


def short_machine(machine: str) -> str:
    """'Intel(R) Xeon(R) Processor, 2 cores' -> 'Intel Xeon': a table cell's name of a machine (of
    each, 'Intel Xeon + AMD EPYC', for a seed whose sittings ran on several: store.sittings_machine)."""
    return " + ".join(
        re.sub(r"\((R|TM)\)| Processor| CPU", "", part.split(",")[0]).strip() for part in machine.split(" + ")
    )


def machine_line(summary: dict) -> str:
    groups = by_machine(summary)
    if len(groups) == 1:
        return f"machine: {next(iter(groups))}, {summary['date']}"
    return (
        "machines: "
        + "; ".join(
            f"seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s['seed']) for s in seeds)}: {machine}"
            for machine, seeds in groups.items()
        )
        + f" (last seed {summary['date']})"
    )


def row_ranks(row: Row) -> int:
    """The ranks of each of a row's runs (its ``world_size`` key)."""
    return next((int(key.split("=")[1]) for key in row.keys if key.startswith("world_size=")), 1)


def jobs_note(summary: dict, ranks: int = 1) -> str:
    """How many seeds of a row shared the machine, where more than one did (``ranks``: each seed's)."""
    jobs = max(s.get("jobs", 1) for s in summary["seeds"])
    each = "one core each" if ranks == 1 else f"{ranks} ranks each"
    return f" (up to {jobs} seeds at once, {each})" if jobs > 1 else ""


def epymarl_lines(row: Row, peer: dict) -> tuple[str, list[str]]:
    """The table's reference cell and the details of a row's EPyMARL runs made here."""
    summary, d = peer["summary"], row.digits
    finals = mean_std([s["final"] / row.agents for s in summary["seeds"]], d)
    details = [
        f"- EPyMARL run here (commit `{summary['epymarl_commit'][:7]}`; {summary['epymarl_versions']}), its QMIX "
        f"defaults on the same protocol, the reference column: `{summary['command']}` (+ `seed=K`, in EPyMARL's tree; "
        f"`python benchmarks/results/run.py {row.epymarl} --epymarl DIR --epymarl-python PY` runs it); "
        f"{machine_line(summary)}; {wall_per_seed(summary)} per seed{jobs_note(summary)}; per seed (best / final "
        "test at step): "
        + "; ".join(
            f"seed {s['seed']}: {s['best'] / row.agents:.{d}f} / {s['final'] / row.agents:.{d}f} at {s['final_step']:,}"
            for s in summary["seeds"]
        )
    ]
    if len(peer["curves"]) > 1:
        paper = papoudakis_returns(per_agent(peer["curves"], row.agents))
        details.append(
            f"- EPyMARL's maximum returns here {paper['max_mean']:.{d}f} ± {paper['max_ci95']:.{d}f} (95 % CI, at "
            f"step {paper['max_step']:,}), average returns {paper['average_mean']:.{d}f} "
            f"± {paper['average_ci95']:.{d}f}"
        )
    last = sorted({s["final_step"] for s in summary["seeds"]})  # its last test: a little before t_max
    return f"EPyMARL run here: {finals} at {' / '.join(f'{step:,}' for step in last)}", details


def cleanrl_runs(row: Row) -> dict | None:
    """The row's CleanRL runs made here (``row.cleanrl``): its summary and each seed's training episodes."""
    summary = kept_summary(row.cleanrl) if row.cleanrl else None
    if summary is None:
        return None
    runs = [read_rows(store.RUNS / row.cleanrl / f"seed{s['seed']}") for s in summary["seeds"]]
    return {"summary": summary, "runs": runs}


def cleanrl_returns(cleanrl: dict) -> list[float]:
    """Each CleanRL seed's training episodes' return over the last 5 % of its steps (its summary's)."""
    return [s["train_return"] for s in cleanrl["summary"]["seeds"] if s["train_return"] is not None]


def ddprl_train_returns(name: str, summary: dict, steps: int) -> list[float]:
    """Each kept ddprl seed's training episodes' return over the last 5 % of ``steps``: the measure
    of a reference on the training episodes (``stats.measure``), at a peer's budget."""
    values = [window_mean(points, steps) for points in seed_curves(name, summary, TRAIN)]
    return [v for v in values if v is not None]


def cleanrl_cell(cleanrl: dict) -> str:
    """The table's reference cell of CleanRL run here."""
    return f"CleanRL run here: {mean_std(cleanrl_returns(cleanrl))} (training episodes)"


def cleanrl_line(row: Row, cleanrl: dict) -> str:
    """The details line of a row's CleanRL runs made here."""
    summary = cleanrl["summary"]
    return (
        f"- CleanRL run here (commit `{summary['cleanrl_commit'][:7]}`; {summary['cleanrl_versions']}), its "
        f"`ppo_continuous_action.py` unchanged on the same task, the line 'CleanRL run here': `{summary['command']}` "
        f"(+ `--seed K`, in CleanRL's tree; `python benchmarks/results/run.py {row.cleanrl} --cleanrl DIR "
        f"--cleanrl-python PY` runs it); {machine_line(summary)}; {wall_per_seed(summary)} per seed"
        f"{jobs_note(summary)}; per seed, the training episodes' return over the last 5 % of its "
        f"{summary['steps']:,} steps: "
        + "; ".join(f"seed {s['seed']}: {fmt(s['train_return'])}" for s in summary["seeds"])
        + f"; mean ± std {mean_std(cleanrl_returns(cleanrl))}"
    )


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
        "(their gzipped `metrics.jsonl` files: `ddprl plot benchmarks/results/runs/ROW/seed*` redraws them).",
        "Each row's command, reference and notes are defined in `benchmarks/results/rows.py`: a new row is",
        "an entry there.",
        "Mean ± standard deviation over seeds; a reference's ± is what its source reports.",
        "Every ddprl run of the table below kept before 2026-11-28 played the same evaluation episodes at",
        "each of its evaluations, env `i` of rank `r` seeded `seed + 1,000,000 + r x 10,000 + i`, so",
        "consecutive seeds shared all but one env's episodes (seed 2's env 0 was seed 1's env 1; TD-MPC2's",
        "rows, 4 envs of one episode, shared 3 of 4): a row's ± then compares its seeds' policies on",
        "largely the same episodes. Runs since then seed them from a hash of the seed and rank, no two",
        "seeds alike (TD-MPC2's reacher-easy seed 3 and finger-spin seed 2 on).",
        "A QMIX row's reference, where it has run, is EPyMARL itself run here on the same task and",
        "protocol (its final test: mean ± standard deviation over its seeds).",
        "A PPO row's line 'CleanRL run here', where it has run, is CleanRL's own `ppo_continuous_action.py`,",
        "unchanged, run here on the same task: its training episodes' return over the last 5 % of the",
        "steps (mean ± standard deviation over its seeds), and ddprl's beside it measured alike.",
        "",
        "| row | reference | steps | ddprl at those steps | ddprl best | seeds | wall time per seed | curve |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for name, row in ROWS.items():
        summary_path = store.RUNS / name / "summary.json"
        partial, lost = in_progress(name), in_progress(name, LOST)
        if not summary_path.exists() and (partial or lost):  # a long row whose seeds are all part-way
            # no curve before a first evaluation: a figure of the reference alone says nothing
            evaluated = any(s["evals"] for s in partial + lost)
            image = draw(name, row).relative_to(store.PAGE.parent) if evaluated else None
            curve_cell = f"[png]({image})" if image else "no evaluation yet"
            best = max(
                (
                    (value, f"seed {s['seed']}{how}")
                    for seeds, how in ((partial, ""), (lost, ", lost"))
                    for s in seeds
                    for _, value in s["evals"]
                ),
                default=None,
            )
            best_cell = f"{best[0]:.{row.digits}f} so far ({best[1]})" if best else ""
            where = "; ".join(
                f"{len(seeds)} {what}, at " + " and ".join(f"{s['step']:,}" for s in seeds)
                for seeds, what in ((partial, "in progress"), (lost, "lost"))
                if seeds
            )
            for ref in row.references:
                lines.append(
                    f"| {row.title} | {ref_cell(ref)} "
                    f"| {ref.steps:,} | not reached: {where} | {best_cell} | 0 | | {curve_cell} |"
                )
            details += [
                f"### {row.title}",
                "",
                f"- command: `{row.command()}` (+ `seed=K`)",
                *([f"- reference: {'; '.join(r.source for r in row.references)}"] if row.references else []),
                *([progress_line(row, partial)] if partial else []),
                *([lost_line(row, lost)] if lost else []),
                *([f"- {row.note}"] if row.note else []),
                "",
                *([f"![{row.title}]({image})", ""] if image else []),
            ]
            continue
        cleanrl = cleanrl_runs(row)
        if not summary_path.exists():
            for ref in row.references:
                lines.append(f"| {row.title} | {ref_cell(ref)} | {ref.steps:,} | not run yet | | | | |")
            if not row.references:
                lines.append(f"| {row.title} | not transcribed | | not run yet | | | | |")
            if cleanrl:
                lines.append(
                    f"| {row.title} | {cleanrl_cell(cleanrl)} | {cleanrl['summary']['steps']:,} | not run yet | | | | |"
                )
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        peer = epymarl_runs(row)
        image = draw(name, row, peer, cleanrl).relative_to(store.PAGE.parent)
        wall = wall_per_seed(summary, name_machine=row.key("device") == "cuda")
        for i, ref in enumerate(row.references):
            ours = [s["at_reference"][i] for s in seeds if s["at_reference"][i] is not None]
            lines.append(
                f"| {row.title} | {ref_cell(ref)} "
                f"| {ref.steps:,} | {mean_std(ours)} | {mean_std([s['best'] for s in seeds])} "
                f"| {len(seeds)} | {wall} | [png]({image}) |"
            )
        if cleanrl:  # ddprl measured as CleanRL's runs here are, at their budget
            steps = cleanrl["summary"]["steps"]
            ours = mean_std(ddprl_train_returns(name, summary, steps))
            lines.append(
                f"| {row.title} | {cleanrl_cell(cleanrl)} | {steps:,} | {ours} "
                f"| {mean_std([s['best'] for s in seeds])} | {len(seeds)} | {wall} | [png]({image}) |"
            )
        per = row.agents  # returns on the page: divided by this
        paper = None
        if row.papoudakis and len(seeds) > 1:
            curves = seed_curves(name, summary)
            paper = papoudakis_returns(per_agent(curves, per))
        reference, peer_details = epymarl_lines(row, peer) if peer else ("not transcribed", [])
        if not row.references:  # ours at the end of the budget
            final = mean_std([s["final"] / per for s in seeds], row.digits)
            best = mean_std([s["best"] / per for s in seeds], row.digits)
            if paper:
                d = row.digits
                best = f"{paper['max_mean']:.{d}f} ± {paper['max_ci95']:.{d}f} (95 % CI) at {paper['max_step']:,}"
            lines.append(
                f"| {row.title} | {reference} | {seeds[0]['final_step']:,} | {final} | {best} "
                f"| {len(seeds)} | {wall} | [png]({image}) |"
            )
        details += [
            f"### {row.title}",
            "",
            f"- command: `{summary['command']}` (+ `seed=K`)",
            *([f"- reference: {'; '.join(r.source for r in row.references)}"] if row.references else []),
            f"- {machine_line(summary)}{jobs_note(summary, row_ranks(row))}",
            "- per seed (at each reference's steps, measured as it is / best evaluation / final evaluation "
            "at step): "
            + "; ".join(
                f"seed {s['seed']}: {' and '.join(fmt(v) for v in s['at_reference']) or '—'} "
                f"/ {s['best'] / per:.{row.digits}f} / {s['final'] / per:.{row.digits}f} at {s['final_step']:,}"
                for s in seeds
            ),
        ]
        if partial:
            details.append(progress_line(row, partial))
        if lost:
            details.append(lost_line(row, lost))
        if paper:
            d = row.digits
            details.append(
                f"- Papoudakis et al.'s measures over these {len(seeds)} seeds: maximum returns "
                f"{paper['max_mean']:.{d}f} ± {paper['max_ci95']:.{d}f} (mean ± 95 % confidence interval at step "
                f"{paper['max_step']:,}, the evaluation with the highest mean); average returns over all "
                f"evaluations {paper['average_mean']:.{d}f} ± {paper['average_ci95']:.{d}f}"
            )
        details += random_line(name, per, row.digits) + peer_details
        if cleanrl:
            details.append(cleanrl_line(row, cleanrl))
        if row.note:
            details.append(f"- {row.note}")
        details += ["", f"![{row.title}]({image})", ""]
    peer_lines, peer_details = peer_section()
    page_lines = lines + supervised_table() + peer_lines + not_yet() + ["", "## Rows", ""] + details + peer_details
    return "\n".join(wrapped for line in page_lines for wrapped in wrap_bullet(line)) + "\n"


def wrap_bullet(line: str) -> list[str]:
    """A bullet of prose as lines of at most 100 characters (Markdown joins them again); any
    other line (a table row, a heading, an image) as it is."""
    if not line.startswith("- ") or len(line) <= 100:
        return [line]
    return textwrap.wrap(
        line[2:], 100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
    )


def progress_line(row: Row, partial: list[dict]) -> str:
    """The page's line for a long row's seeds still part-way (:func:`store.in_progress`)."""
    return (
        "- in progress (each seed as its last sitting left it, stopped with a checkpoint that `--resume` goes "
        "on from; a seed leaves this line for the results when it ends): " + "; ".join(how_far(row, s) for s in partial)
    )


def lost_line(row: Row, lost: list[dict]) -> str:
    """The page's line for a long row's attempts whose checkpoints were lost (:func:`store.set_aside_lost`)."""
    return (
        "- lost (a seed's earlier attempt, stopped with a checkpoint that went with the machine it was on: "
        "checkpoints and replay buffers are not committed, so the seed started again; what it measured is "
        "kept here and drawn, and counts for nothing above): " + "; ".join(how_far(row, s) for s in lost)
    )


def how_far(row: Row, seed: dict) -> str:
    """One part-way seed (:func:`store.in_progress`): its step, training time and evaluations so far."""
    evals = ", ".join(f"{value:.{row.digits}f} at {step:,}" for step, value in seed["evals"]) or "none yet"
    return (
        f"seed {seed['seed']} at {seed['step']:,} of {int(row.key('steps')):,} steps after "
        f"{seed['wall_s'] / 3600:.1f} h of training{where_trained(seed['hours'])}, evaluations: {evals}"
    )


def where_trained(hours: dict[str | None, float]) -> str:
    """' on the AMD EPYC', or ' (AMD EPYC 2.5 h, Intel Xeon 1.0 h)' when a part-way seed's sittings
    ran on several machines (store.hours_by_machine); nothing where none was recorded."""
    if all(machine is None for machine in hours):
        return ""
    if len(hours) == 1:
        return f" on the {short_machine(next(iter(hours)))}"
    return " (" + ", ".join(f"{short_machine(m) if m else 'not recorded'} {h:.1f} h" for m, h in hours.items()) + ")"


def draw_peer(name: str, row: PeerRow, seeds: list[int], steps: int) -> Path:
    """The training episodes' return of every run of a peer row against steps: one colour per
    implementation, each seed's curve faint, and bold the mean over seeds of 2 %-of-the-steps
    bins (one update's value is the mean of the few episodes that ended in it: noisy)."""
    from ddprl.plot import figure, load_runs

    runs = load_runs([store.RUNS / name / f"{impl}-seed{seed}" for impl in row.impls for seed in seeds])
    fig = figure(runs, [TRAIN])
    ax = fig.axes[0]
    colours = {impl: f"C{i}" for i, impl in enumerate(IMPLS)}
    for line in ax.get_lines():  # labelled by run directory: <impl>-seed<K>
        line.set_color(colours[line.get_label().rsplit("-seed", 1)[0]])
        line.set_linewidth(0.6)
        line.set_alpha(0.35)
    fig.legends.clear()  # figure()'s legend names each run; one entry per implementation instead
    width = steps / 50
    handles = []
    for impl in row.impls:
        per_seed = [binned_mean(runs[f"{impl}-seed{seed}"], TRAIN, width) for seed in seeds]
        common = sorted(set.intersection(*(set(b) for b in per_seed)))
        mean = [statistics.mean(b[i] for b in per_seed) for i in common]
        handles += ax.plot([(i + 0.5) * width for i in common], mean, color=colours[impl], linewidth=2)
    ax.legend(handles, [IMPLS[impl] for impl in row.impls], loc="lower right", fontsize=8)
    ax.set_title(wrap_title(f"{row.title}: {METRIC_NAMES[TRAIN]}, {len(seeds)} seed(s) each"), fontsize=10)
    store.IMAGES.mkdir(parents=True, exist_ok=True)
    path = store.IMAGES / f"{name}.png"
    fig.savefig(path, dpi=90)
    return path


def across(seeds: list[dict], impl: str, key: str) -> list[float]:
    """``key`` of ``impl``'s run of every seed of a peer row's summary, where it has one."""
    return [s[impl][key] for s in seeds if impl in s and s[impl][key] is not None]


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def wall_cell(runs: list[dict]) -> str:
    """Mean end-to-end seconds per seed, with the compile and the training alone after it."""
    if not runs:  # an implementation the row does not run
        return "—"
    wall = statistics.mean(r["wall_s"] for r in runs)
    compiles = [r["compile_s"] for r in runs if r["compile_s"] is not None]
    compiled = f"compile {seconds(statistics.mean(compiles))}, " if compiles else ""
    return f"{seconds(wall)} ({compiled}training {seconds(statistics.mean(r['train_s'] for r in runs))})"


def peer_section() -> tuple[list[str], list[str]]:
    """The page's section on the peer rows (a table and the shared notes), and their details."""
    lines = [
        "",
        "## The JAX engine against PureJaxRL, on the same CPU",
        "",
        f"PureJaxRL's PPO ({PUREJAXRL_REPO}, `purejaxrl/ppo.py` at commit `{PUREJAXRL_COMMIT[:7]}`), run",
        "here beside ddprl's two engines (the JAX one on one device, as PureJaxRL, and on two), every",
        "run with PureJaxRL's own hyperparameters (ppo.py's configuration; for MinAtar, its",
        "`examples/brax_minatar.ipynb`'s, which calls the same code). Each cell is the mean return",
        "of the training episodes (sampled actions) over the last 5 % of the steps, what PureJaxRL",
        "logs; ddprl's greedy evaluation (10 episodes) at the end is its own column. Wall time per",
        "seed: end to end (start-up, compile, evaluations), then the compile and the training alone.",
        "One run at a time, same machine, nothing else running.",
        "",
        f"| task | steps | {' | '.join(IMPLS.values())} | ddprl greedy eval at the end: {' / '.join(DDPRL_IMPLS)} "
        f"| wall time per seed: {' / '.join(IMPLS)} | seeds | curve |",
        "|---|---|" + "---|" * len(IMPLS) + "---|---|---|---|",
    ]
    details = []
    for name, row in PEER_ROWS.items():
        summary_path = store.RUNS / name / "summary.json"
        if not summary_path.exists():
            steps = ddprl_ppo_keys(row.config())[1].split("=")[1]
            lines.append(
                f"| {row.title} | {int(steps):,} | not run yet (`run.py {name} --purejaxrl DIR`) "
                + "| " * (len(IMPLS) + 3)
                + "|"
            )
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        image = draw_peer(name, row, [s["seed"] for s in seeds], summary["steps"]).relative_to(store.PAGE.parent)
        cells = [mean_std(across(seeds, impl, "train_return")) for impl in IMPLS]
        evals = " / ".join(mean_std(across(seeds, impl, "eval_return")) for impl in DDPRL_IMPLS)
        walls = " / ".join(wall_cell([s[impl] for s in seeds if impl in s]) for impl in IMPLS)
        lines.append(
            f"| {row.title} | {summary['steps']:,} | {' | '.join(cells)} | {evals} | {walls} | {len(seeds)} "
            f"| [png]({image}) |"
        )
        pj = summary["purejaxrl"]
        details += [
            f"### {row.title}: ddprl against PureJaxRL",
            "",
            f"- PureJaxRL: `{PUREJAXRL_CLONE}`, then `python benchmarks/results/run.py {name} --purejaxrl purejaxrl "
            f"--purejaxrl-python purejaxrl-venv/bin/python --seeds {len(seeds)}`; its environment: "
            + ", ".join(f"{k} {v}" for k, v in pj["versions"].items()),
            f"- PureJaxRL's config: `{json.dumps(pj['config'])}`",
            *(f"- ddprl {impl}: `{command}` (+ `seed=K`)" for impl, command in summary["commands"].items()),
            f"- machine: {summary['machine']}, {summary['date']}",
            "- per seed (training episodes' return over the last 5 % / greedy eval at the end / time: "
            "end to end, compile, training): "
            + "; ".join(
                f"seed {s['seed']}: "
                + ", ".join(
                    f"{impl} {fmt(s[impl]['train_return'])} / {fmt(s[impl]['eval_return'])} / "
                    f"{seconds(s[impl]['wall_s'])}, {seconds(s[impl]['compile_s'])}, {seconds(s[impl]['train_s'])}"
                    for impl in row.impls
                )
                for s in seeds
            ),
        ]
        if row.note:
            details.append(f"- {row.note}")
        details += ["", f"![{row.title}: ddprl against PureJaxRL]({image})", ""]
    lines += [
        "",
        "To run them (PureJaxRL from its own checkout, in an environment of its own; ddprl never imports it):",
        "",
        "```bash",
        *PUREJAXRL_CLONE.split(" && "),
        PUREJAXRL_VENV.split(" && ")[0],
        PUREJAXRL_VENV.split(" && ")[1],
        *(
            f"python benchmarks/results/run.py {name} --purejaxrl purejaxrl "
            "--purejaxrl-python purejaxrl-venv/bin/python --seeds 3"
            for name in PEER_ROWS
        ),
        "```",
        "",
        "How PureJaxRL's configuration maps onto ddprl's keys: `num_envs` is global (NUM_ENVS), `batch_size`",
        "is per device or rank (PureJaxRL's minibatch, NUM_ENVS x NUM_STEPS / NUM_MINIBATCHES, on one device,",
        f"its 1/{PEER_DEVICES} on {PEER_DEVICES}: the same minibatch and optimizer steps per epoch), `steps` is",
        "PureJaxRL's whole updates (for ppo.py's 500k, 976 updates of 512 steps: it rounds down, ddprl would",
        "round up), `activation` is its ACTIVATION, and the other keys carry its values (`ddprl_ppo_keys` in",
        "benchmarks/results/rows.py).",
        "What still differs:",
        "",
        *(f"- {note}" for note in PEER_NOTES),
    ]
    return lines, details


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
        summary_path = store.RUNS / name / "summary.json"
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
