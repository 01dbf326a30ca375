"""QMIX against EPyMARL's unchanged ``src/main.py`` (its own tree and environment, through ``epymarl_probe.py``),
EPyMARL's QMIX settings written out on both sides (SHARED), one thread a process.

Speed, no evaluation: env steps/s and updates/s from 10 % of --steps to the end; ddprl's 32 episodes an update split
over the ranks (--weak-scaling: 32 a rank); --repeats rotate the rows, medians kept. The learning curves against
EPyMARL: the results page's QMIX rows (results/run.py).

    python benchmarks/qmix_speed.py [--task Foraging-8x8-2p-2f-coop-v3] [--steps 100000] [--world-sizes 1 2]
        [--num-envs 1 8] [--weak-scaling] [--skip-epymarl] [--ddprl-extra K=V ...]
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import tempfile
from pathlib import Path

import harness as h

PROBE = Path(__file__).resolve().parent / "epymarl_probe.py"
# EPyMARL's tree and environment (sacred still imports pkg_resources, gone from setuptools 81; EPyMARL finds MPE in
# pettingzoo.mpe, which PettingZoo 1.26 moved out to mpe2)
EPYMARL_VENV = (
    "git clone https://github.com/uoe-agents/epymarl /work/peers/epymarl && "
    "git -C /work/peers/epymarl checkout cbc38c0 && python3.11 -m venv /work/peers/epymarl-venv && "
    "/work/peers/epymarl-venv/bin/pip install torch sacred pyyaml numpy gymnasium lbforaging rware scipy "
    "'setuptools<81' pettingzoo==1.24.3 pygame"
)
PACKAGES = ("torch", "numpy", "gymnasium", "lbforaging", "rware", "pettingzoo")
# EPyMARL's QMIX settings, written out on both sides: ddprl key[:EPyMARL key]=value
SHARED = """batch_size=32 buffer_size=5000 lr=0.0005 gamma=0.99 target_update_interval:target_update_interval_or_tau=200
    epsilon_start=1.0 epsilon_finish=0.05 epsilon_anneal_steps:epsilon_anneal_time=50000 use_rnn=False hidden_dim=64
    obs_agent_id=True obs_last_action=False double_q=True standardise_rewards=True mixer=qmix mixing_embed_dim=32
    hypernet_layers=2 hypernet_embed=64 max_grad_norm:grad_norm_clip=10""".split()


def shared(epymarl: bool = False) -> list[str]:
    """SHARED as EPyMARL's keys, or as ddprl's (its booleans in lower case)."""
    pairs = [(keys.split(":"), value) for keys, value in (kv.split("=") for kv in SHARED)]
    if epymarl:
        return [f"{keys[-1]}={value}" for keys, value in pairs]
    return [f"{keys[0]}={value.lower() if value in ('True', 'False') else value}" for keys, value in pairs]


def task_spec(task: str) -> tuple[str, int]:
    """EPyMARL's gymma key and the episode limit of an LBF, RWARE or MPE task."""
    for prefix, key, limit in (("Foraging", "lbforaging:", 50), ("rware", "rware:", 500), ("simple_", "pz-mpe-", 25)):
        if task.startswith(prefix):
            return key + (task.replace("_", "-") if prefix == "simple_" else task), limit
    raise SystemExit(f"--task {task}: an LBF (Foraging-...), RWARE (rware-...) or MPE (simple_...) task")


def epymarl_command(args, *more: str) -> list[str]:
    """EPyMARL's QMIX on ``args.task`` through the probe, ``more`` (test and runner keys), then SHARED."""
    key, limit = task_spec(args.task)
    cmd = [args.epymarl_python, str(PROBE), args.epymarl, "--config=qmix", "--env-config=gymma", "with"]
    cmd += [f"env_args.key={key}", f"env_args.time_limit={limit}", f"t_max={args.steps}", f"seed={args.seed}"]
    cmd += ["use_cuda=False", "save_model=False", "use_tensorboard=False", "use_wandb=False", "common_reward=True"]
    return cmd + list(more) + shared(epymarl=True)


def run_probe(args, cmd: list[str], tmp: Path) -> tuple[dict, dict]:
    """EPyMARL under the probe, its sacred output in ``tmp``: the probe's record, and :func:`harness.run`'s."""
    out = {"EPYMARL_PROBE_OUT": str(tmp / "probe.json"), "EPYMARL_PROBE_SACRED_DIR": str(tmp / "sacred")}
    run = h.run(cmd, env={**h.ONE_THREAD, **out}, cwd=args.epymarl, timeout=args.timeout)
    return json.loads((tmp / "probe.json").read_text()), run


def rates(records: list[tuple], skip: float, run: dict) -> dict:
    """Rates over (seconds, env steps, updates, seconds not training so far) from the first record past ``skip``."""
    first = min(next((i for i, r in enumerate(records) if r[1] >= skip), len(records)), len(records) - 2)
    (t0, s0, u0, x0), (t1, s1, u1, x1) = records[first], records[-1]
    seconds = (t1 - t0) - (x1 - x0)
    return {"fps": (s1 - s0) / seconds, "ups": (u1 - u0) / seconds, "wall": run["wall"], "other": run["other"]}


def speed(args) -> None:
    """The rows, alternated, and their table."""
    skip, base, limit = 0.1 * args.steps, "EPyMARL episode runner (1 env)", task_spec(args.task)[1]

    def epymarl(r: int) -> dict:
        """EPyMARL's one greedy test (test_nepisode=1, its minimum) comes right after its first episode, never again."""
        cmd = epymarl_command(args, "test_nepisode=1", f"test_interval={10 * args.steps + 1}")
        with tempfile.TemporaryDirectory() as tmp:
            probe, run = run_probe(args, cmd, Path(tmp))
        return rates(probe["calls"], skip, run)

    def ddprl(n: int, envs: int) -> dict:
        keys = f"algo=qmix task={args.task} steps={args.steps} world_size={n} num_envs={envs * n} seed={args.seed} "
        keys += f"env_kwargs.time_limit={limit} log_freq={max(1, min(10_000, args.steps // 10))} " + " ".join(shared())
        keys += f" update_every={limit * n}" if args.weak_scaling else f" batch_size={32 // n}"  # 32 a rank, or in all
        run = h.train([*keys.split(), *h.QUIET, *args.ddprl_extra], env=h.ONE_THREAD, timeout=args.timeout)
        records = [(r["wall_time"], r["step"], r.get("train/updates", math.nan), 0.0) for r in run["rows"]]
        return {**rates(records, skip, run), "world_size": n, "envs": envs}

    plan = {} if args.skip_epymarl else {base: epymarl}
    for e, n in itertools.product(args.num_envs, args.world_sizes):
        plan[f"ddprl {n} rank(s) x {e} env(s)"] = lambda r, n=n, e=e: ddprl(n, e)
    runs, table = h.alternate(plan, args.repeats, max_other=args.max_other, retries=args.retries), []
    rows = {name: h.middle(rs, "fps") for name, rs in runs.items()}
    for name, row in rows.items():  # medians of each
        row |= {k: h.median(r.get(k, math.nan) for r in runs[name]) for k in ("fps", "ups", "wall", "other")}
    one = {r["envs"]: r["fps"] for r in rows.values() if r.get("world_size") == 1}
    for name, r in rows.items():
        if "error" in r:
            table.append([name, "failed: " + r["error"].splitlines()[0]])
            continue
        vs = f"{r['fps'] / rows[base]['fps']:.2f}x" if "fps" in rows.get(base, {}) else "-"
        n, envs = r.get("world_size", 1), r.get("envs")
        eff = f"{r['fps'] / (n * one[envs]):.0%}" if n > 1 and envs in one else "-"
        name += "*" * any(x.get("other", 0) > args.max_other for x in runs[name])  # contended
        table.append([name, f"{r['fps']:,.0f}", f"{r['ups']:,.1f}", vs, eff, f"{r['wall']:.0f}", f"{r['other']:.2f}"])
    h.table(["row", "env steps/s", "updates/s", "vs EPyMARL", "scaling eff.", "wall s", "other cores"], table)


def epymarl_commit(tree: str) -> str:
    """The EPyMARL tree's git HEAD, else a COMMIT file beside src/ (an exported tree)."""
    path = Path(tree) / "COMMIT"
    return h.git_head(tree) or (path.read_text().split()[0] if path.exists() else "unknown")


def main() -> None:
    p = h.parser(__doc__, repeats=1, contention=(0.2, 1))
    p.add_argument("--task", default="Foraging-8x8-2p-2f-coop-v3", help="an LBF, RWARE or MPE task")
    p.add_argument("--steps", type=int, default=100_000, help="env steps per row, all envs and ranks")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2], help="ddprl world sizes")
    p.add_argument("--num-envs", type=int, nargs="*", default=[1, 8], help="ddprl envs per rank")
    p.add_argument("--weak-scaling", action="store_true", help="ddprl: 32 episodes an update per rank")
    p.add_argument("--ddprl-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more keys for the ddprl rows")
    p.add_argument("--epymarl", default="/work/peers/epymarl", help="EPyMARL's tree (holds src/main.py)")
    p.add_argument("--epymarl-python", default="/work/peers/epymarl-venv/bin/python", help=f"made by: {EPYMARL_VENV}")
    p.add_argument("--skip-epymarl", action="store_true")
    p.add_argument("--timeout", type=float, help="seconds per run")
    args = p.parse_args()
    found = Path(args.epymarl, "src", "main.py").is_file() and Path(args.epymarl_python).exists()
    if not (args.skip_epymarl or found):
        p.error(f"no EPyMARL at --epymarl {args.epymarl} or --epymarl-python {args.epymarl_python}; or --skip-epymarl")
    print(f"### QMIX training speed on {args.task}, {args.steps:,} env steps, seed {args.seed}\n\n{h.machine()}")
    print(f"ddprl: {h.versions(sys.executable, PACKAGES)}")
    if not args.skip_epymarl:
        print(f"EPyMARL {epymarl_commit(args.epymarl)}: {h.versions(args.epymarl_python, PACKAGES)}")
    print("Shared: " + ", ".join(shared()) + "\n", flush=True)
    speed(args)


if __name__ == "__main__":
    main()
