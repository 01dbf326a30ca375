"""ddprl beside published numbers and peer libraries: run one row of docs/results.md, or rebuild the page.

    python benchmarks/results/run.py ROW [--seeds 3] [--resume] [--jobs N]   # train its seeds, keep their curves
    python benchmarks/results/run.py --page      # docs/results.md, results.csv and a figure per suite from runs/
    python benchmarks/results/run.py --list      # the rows and their commands
    python benchmarks/results/run.py --stale     # the kept runs whose row's keys now resolve to other values
    python benchmarks/results/run.py QMIX_ROW --random   # random actions' return on its task (random.json)

Long rows (TD-MPC2) train across sittings (training.py): SIGTERM or SIGUSR1 checkpoints them (exit 75), ``--resume``
goes on. GPU rows run through ``bash benchmarks/gpu_session.sh results``. Peer libraries run from checkouts and
environments of their own (rows.py's ``*_CLONE``, ``*_VENV``): ``--purejaxrl DIR --purejaxrl-python PY`` for ``jax-*``
rows, ``--epymarl``/``--cleanrl``/``--jaxmarl`` alike; ``--steps N`` shortens PureJaxRL's and CleanRL's, ``--runs DIR``
keeps all under DIR (smoke runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: this package, harness.py, qmix_speed.py

from results import peers, provenance, rows, store, training  # noqa: E402 (the path above first)
from results.page import page  # noqa: E402

LIBRARIES = {"purejaxrl": rows.PEER_ROWS, "epymarl": rows.EPYMARL_ROWS, "cleanrl": rows.CLEANRL_ROWS}
LIBRARIES |= {"jaxmarl": rows.JAXMARL_ROWS}


def main() -> int:
    ours = {**rows.ROWS, **rows.SUPERVISED_ROWS, **rows.PEER_ROWS}
    every = {**ours, **rows.EPYMARL_ROWS, **rows.CLEANRL_ROWS, **rows.JAXMARL_ROWS}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row", nargs="?", choices=sorted(every))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--resume", action="store_true", help="keep the seeds the row's summary holds")
    parser.add_argument("--jobs", type=int, default=1, help="seeds at once (EPyMARL and CleanRL: one core each)")
    parser.add_argument("--page", action="store_true", help="rebuild docs/results.md from the kept runs")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--stale", action="store_true", help="the kept runs whose config the row no longer gives")
    parser.add_argument("--random", action="store_true", help="QMIX rows: random actions' return on the task")
    for library in LIBRARIES:
        parser.add_argument(f"--{library}", type=Path, help=f"{library} rows: the library's checkout")
        default = os.environ.get(f"{library.upper()}_PYTHON")
        parser.add_argument(f"--{library}-python", default=default, help="the python of its own environment")
    parser.add_argument("--steps", type=int, help="peer and cleanrl rows: a shorter budget (smoke runs)")
    parser.add_argument("--runs", type=Path, help="keep the runs, page and figure under this folder instead")
    args = parser.parse_args()
    if args.runs:
        store.RUNS, store.PAGE, store.IMAGES = args.runs, args.runs / "results.md", args.runs / "results"
    if args.list:
        commands = {name: row.command() for name, row in ours.items()}
        commands |= {n: f"{peers.epymarl_row_command(t)}  (EPyMARL's tree)" for n, t in rows.EPYMARL_ROWS.items()}
        commands |= {n: f"{peers.cleanrl_row_command(n)} --seed K  (CleanRL's tree)" for n in rows.CLEANRL_ROWS}
        commands |= {n: f"{peers.jaxmarl_row_command(n)} alg.SEED=K  (JaxMARL's tree)" for n in rows.JAXMARL_ROWS}
        print("\n".join(f"{name:34s} {command}" for name, command in commands.items()))
        return 0
    if args.stale:
        stale = provenance.stale_runs()
        print("\n".join(f"{folder.relative_to(store.RUNS)}: {'; '.join(keys)}" for folder, keys in stale))
        print(f"{len(stale)} of {len(provenance.kept_runs())} kept runs are stale")
        return 0
    library = next((lib for lib, named in LIBRARIES.items() if args.row in named), None)
    if library and getattr(args, library) is None:
        parser.error(f"{args.row} runs {library}: --{library} DIR, its checkout")
    checkout, python = library and getattr(args, library).resolve(), library and getattr(args, f"{library}_python")
    if args.steps and library not in ("purejaxrl", "cleanrl"):
        parser.error("--steps shortens peer and cleanrl-* rows only")
    if args.random:
        if args.row not in rows.RANDOM_TASKS:
            parser.error(f"--random: one of the QMIX rows {', '.join(rows.RANDOM_TASKS)}")
        print(json.dumps(peers.random_baseline(args.row)))
    elif library == "purejaxrl":
        peers.run_peer_row(args.row, args.seeds, checkout, python, args.steps, args.resume)
    elif library == "epymarl":
        peers.run_epymarl_row(args.row, args.seeds, checkout, python, args.resume, args.jobs)
    elif library == "jaxmarl":
        peers.run_jaxmarl_row(args.row, args.seeds, checkout, python, args.resume, args.jobs)
    elif library == "cleanrl":
        peers.run_cleanrl_row(args.row, args.seeds, checkout, python, args.resume, args.jobs, args.steps)
    elif args.row:
        training.pass_on_stop_signals()
        training.run_row(args.row, args.seeds, args.resume, args.jobs)
    if not (args.row or args.page):
        parser.error("name a ROW, or --page, or --list")
    store.PAGE.write_text(page())
    print(f"wrote {store.PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
