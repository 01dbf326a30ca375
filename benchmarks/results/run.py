"""Published results, reproduced: run one row of docs/results.md, or rebuild the page.

    python benchmarks/results/run.py ROW [--seeds 3]      # train each seed, keep its curve, summarise
    python benchmarks/results/run.py ROW --resume         # only the seeds the row's summary lacks
    python benchmarks/results/run.py --page               # docs/results.md and its PNGs from what is kept
    python benchmarks/results/run.py --list               # the rows and their commands
    python benchmarks/results/run.py QMIX_ROW --random    # random actions' return on its task (random.json)

Each seed trains with ``ddprl train`` (the row's keys, then ``seed=K``) in a scratch directory;
its ``metrics.jsonl`` (gzipped) and ``config.yaml`` are kept under ``benchmarks/results/runs/<row>/seed<K>/``
(small, committed, so anyone can re-plot), checkpoints and TensorBoard files are not.
``summary.json`` beside them holds what the page shows: per seed the evaluation return at the
reference's step count, the best and the final one, the wall time and the machine. The page is
built only from those files, so its numbers are the ones the runs printed. The summary is
rewritten after each seed: a row stopped part-way keeps the seeds it finished, and ``--resume``
trains the missing ones later (a row too long for one sitting). ``--jobs N`` trains N seeds at once.

Long rows (TD-MPC2: hours per seed) go further: each seed trains in ``benchmarks/results/work/<row>/seed<K>/``
(git-ignored), checkpointed with its replay buffer. SIGTERM or SIGUSR1 to this script passes on to
its runs, which save a checkpoint and exit 75 (so does the script), and each stopped seed's metrics
so far are kept in ``runs/<row>/in_progress/seed<K>/`` (committed: the page shows how far each seed
got, and draws it); the same command with ``--resume`` goes on from each seed's checkpoint, and a
finished seed is kept as any other (its in-progress copy removed)::

    python benchmarks/results/run.py tdmpc2-cartpole-swingup --seeds 3 --jobs 2 --resume   # again each sitting
    kill -TERM <its pid>                                                                    # at a sitting's end

(``--jobs 2`` on 2 cores: a seed to each core, the third when one ends. ``--jobs 3`` finishes the
row about as soon, but keeps no seed until near its end.) The work directory does not outlive its
machine: a sitting on a new one finds a seed's in-progress record and no checkpoint, moves the
record to ``runs/<row>/lost/seed<K>`` (kept and drawn: what that attempt measured) and starts the
seed again.

GPU rows (``tdmpc2-<task>-gpu``: ``device=cuda``) are long rows too, trained on a GPU machine by
``bash benchmarks/gpu_session.sh results`` (their missing seeds, in order, as far as its time goes);
the summary names the GPU with the machine.

Peer rows (``jax-cartpole``, ``jax-acrobot``) run another library here, on the same machine:
per seed, PureJaxRL's own PPO, then ddprl ``engine=jax`` on 1 and on 2 simulated CPU devices,
then ddprl ``engine=torch`` (2 ranks), all with the hyperparameters of PureJaxRL's ``ppo.py``. PureJaxRL
is not part of ddprl: it is imported from a checkout you make, and runs in an environment of
its own (flax, distrax, ...) through ``purejaxrl_ppo.py`` beside this file::

    git clone https://github.com/luchris429/purejaxrl purejaxrl
    git -C purejaxrl checkout 31756b197773a52db763fdbe6d635e4b46522a73
    python3.11 -m venv purejaxrl-venv
    purejaxrl-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 gymnax==1.0.1 flax==0.12.8 distrax==0.1.9 \
        tfp-nightly==0.26.0.dev20261027 optax==0.2.8 chex==0.1.92 brax==0.14.2 mujoco==3.17.0 \
        mujoco-mjx==3.17.0 navix==0.7.4
    python benchmarks/results/run.py jax-cartpole --purejaxrl purejaxrl \
        --purejaxrl-python purejaxrl-venv/bin/python [--seeds 3]
    python benchmarks/results/run.py jax-cartpole ... --seeds 1 --steps 20480 --runs /tmp/smoke   # a smoke run

Their runs are kept as ``runs/<row>/{purejaxrl,jax1,jax,torch}-seed<K>/`` (PureJaxRL's curve
converted to ddprl's ``metrics.jsonl``, so ``ddprl plot`` draws them all), and the page sets the
training-episode returns side by side with each run's wall time (compile and training apart).
``--runs DIR`` keeps runs, page and PNGs under DIR instead of the repository (smoke runs).

EPyMARL rows (``epymarl-lbf-8x8-2p-2f-coop``, ...) run EPyMARL's own QMIX here on the task of two
QMIX rows, on EPyMARL's protocol, and stand as those rows' reference (Papoudakis et al.'s table
is not transcribed). EPyMARL is not part of ddprl either: its unchanged ``src/main.py`` runs from
a tree you make, in an environment of its own (``EPYMARL_VENV`` in ``benchmarks/qmix_speed.py``),
through ``benchmarks/epymarl_probe.py``::

    python benchmarks/results/run.py epymarl-lbf-8x8-2p-2f-coop --epymarl /work/peers/epymarl \
        --epymarl-python /work/peers/epymarl-venv/bin/python --seeds 3 --jobs 2

Each seed's tests are kept as
``runs/<row>/seed<K>/`` like a ddprl run's evaluations; EPyMARL runs on one core, so ``--jobs N``
runs N seeds at once.

CleanRL rows (``cleanrl-humanoid-v4``) run CleanRL's own PPO, ``cleanrl/ppo_continuous_action.py``, here
on the task of the PPO rows that name it (the Humanoid-v4 rows), and stand beside CleanRL's published
number there as "CleanRL run here": the same code and hyperparameters on this machine, measured as
ddprl's runs are (the training episodes' return over the last 5 % of the steps). CleanRL is not part of
ddprl either: its script runs unchanged from a checkout you make, in an environment of its own
(``CLEANRL_VENV`` in ``rows.py``: CleanRL's gymnasium 0.29.1 and MuJoCo 2.3.3)::

    git clone https://github.com/vwxyzjn/cleanrl cleanrl
    git -C cleanrl checkout fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
    python3 -m venv cleanrl-venv
    cleanrl-venv/bin/pip install torch==2.13.0 "gymnasium==0.29.1" "mujoco==2.3.3" "numpy<2" tyro tensorboard imageio
    python benchmarks/results/run.py cleanrl-humanoid-v4 --cleanrl cleanrl \
        --cleanrl-python cleanrl-venv/bin/python --seeds 3 --jobs 2
    python benchmarks/results/run.py cleanrl-humanoid-v4 ... --seeds 1 --steps 8192 --runs /tmp/smoke   # a smoke run

Each seed runs in a scratch directory (the script writes ``runs/`` into its working directory), on one
core (``OMP_NUM_THREADS=1``, ``--no-cuda``): ``--jobs N`` runs N seeds at once. The training episodes
it prints (``global_step=..., episodic_return=[...]``) are kept as ``runs/<row>/seed<K>/`` (ddprl's
``train/episode_return`` at the step each ended, so ``ddprl plot`` draws them beside ddprl's runs).

The harness beside this file: ``rows.py`` (each row's command, reference and notes: where a row is
added), ``training.py`` (ddprl's seeds), ``peers.py`` (EPyMARL, CleanRL, PureJaxRL, random actions),
``baselines.py`` (the supervised rows' scikit-learn baselines), ``store.py`` (the kept runs),
``stats.py`` (numbers from curves) and ``page.py`` (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: this package, machine.py, qmix_*.py

from results import store  # noqa: E402 (the path above first)
from results.page import page  # noqa: E402
from results.peers import (  # noqa: E402
    cleanrl_row_command,
    epymarl_row_command,
    random_baseline,
    run_cleanrl_row,
    run_epymarl_row,
    run_peer_row,
)
from results.rows import (  # noqa: E402
    CLEANRL_CLONE,
    CLEANRL_ROWS,
    EPYMARL_ROWS,
    PEER_ROWS,
    PUREJAXRL_CLONE,
    QMIX_TASKS,
    ROWS,
    SUPERVISED_ROWS,
)
from results.training import pass_on_stop_signals, run_row  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "row", nargs="?", choices=sorted({**ROWS, **SUPERVISED_ROWS, **PEER_ROWS, **EPYMARL_ROWS, **CLEANRL_ROWS})
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--resume", action="store_true", help="keep the seeds this row's summary already holds, train the others"
    )
    parser.add_argument("--page", action="store_true", help="rebuild docs/results.md from the kept runs")
    parser.add_argument("--list", action="store_true")
    parser.add_argument(
        "--random", action="store_true", help="QMIX rows: the return of random actions on the row's task (random.json)"
    )
    parser.add_argument("--purejaxrl", type=Path, help=f"peer rows: a checkout of PureJaxRL ({PUREJAXRL_CLONE})")
    parser.add_argument(
        "--purejaxrl-python",
        default=os.environ.get("PUREJAXRL_PYTHON"),
        help="peer rows: the python of PureJaxRL's own environment (default: $PUREJAXRL_PYTHON)",
    )
    parser.add_argument("--epymarl", type=Path, help="epymarl-* rows: an EPyMARL tree (github.com/uoe-agents/epymarl)")
    parser.add_argument(
        "--epymarl-python",
        default=os.environ.get("EPYMARL_PYTHON"),
        help="epymarl-* rows: the python of EPyMARL's own environment (default: $EPYMARL_PYTHON)",
    )
    parser.add_argument("--cleanrl", type=Path, help=f"cleanrl-* rows: a checkout of CleanRL ({CLEANRL_CLONE})")
    parser.add_argument(
        "--cleanrl-python",
        default=os.environ.get("CLEANRL_PYTHON"),
        help="cleanrl-* rows: the python of CleanRL's own environment (default: $CLEANRL_PYTHON)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="seeds run at once (EPyMARL, CleanRL and one-rank ddprl rows run on one core each)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="peer and cleanrl-* rows: a shorter budget (PureJaxRL's TOTAL_TIMESTEPS, CleanRL's --total-timesteps)",
    )
    parser.add_argument(
        "--runs", type=Path, help="keep the runs, the page and its PNGs under this folder instead (smoke runs)"
    )
    args = parser.parse_args()
    if args.runs:
        store.RUNS, store.PAGE, store.IMAGES = args.runs, args.runs / "results.md", args.runs / "results"
    if args.list:
        for name, row in {**ROWS, **SUPERVISED_ROWS, **PEER_ROWS}.items():
            print(f"{name:34s} {row.command()}")
        for name, task in EPYMARL_ROWS.items():
            print(f"{name:34s} {epymarl_row_command(task)}  (EPyMARL's tree)")
        for name in CLEANRL_ROWS:
            print(f"{name:34s} {cleanrl_row_command(name)} --seed K  (CleanRL's tree)")
        return 0
    if args.random:
        if args.row not in QMIX_TASKS:
            parser.error(f"--random: one of the QMIX rows {', '.join(QMIX_TASKS)}")
        print(json.dumps(random_baseline(args.row)))
    elif args.row in PEER_ROWS:
        if args.purejaxrl is None:
            parser.error(f"{args.row} runs PureJaxRL too: --purejaxrl DIR, a checkout made with {PUREJAXRL_CLONE}")
        run_peer_row(args.row, args.seeds, args.purejaxrl.resolve(), args.purejaxrl_python, args.steps, args.resume)
    elif args.row in EPYMARL_ROWS:
        if args.epymarl is None:
            from qmix_speed import EPYMARL_VENV

            parser.error(f"{args.row} runs EPyMARL: --epymarl DIR, an EPyMARL tree ({EPYMARL_VENV})")
        run_epymarl_row(args.row, args.seeds, args.epymarl.resolve(), args.epymarl_python, args.resume, args.jobs)
    elif args.row in CLEANRL_ROWS:
        if args.cleanrl is None:
            parser.error(f"{args.row} runs CleanRL: --cleanrl DIR, a checkout made with {CLEANRL_CLONE}")
        run_cleanrl_row(
            args.row, args.seeds, args.cleanrl.resolve(), args.cleanrl_python, args.resume, args.jobs, args.steps
        )
    elif args.steps:
        parser.error("--steps shortens peer and cleanrl-* rows only")
    elif args.row:
        pass_on_stop_signals()
        run_row(args.row, args.seeds, args.resume, args.jobs)
    if args.page or args.row:
        store.PAGE.write_text(page())
        print(f"wrote {store.PAGE}")
    if not (args.row or args.page):
        parser.error("name a ROW, or --page, or --list")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
