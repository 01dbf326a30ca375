"""QMIX against EPyMARL's unchanged ``src/main.py`` (its own tree and environment, through ``epymarl_probe.py``),
EPyMARL's QMIX settings written out on both sides (SHARED), one thread a process.

    python benchmarks/qmix_speed.py [--task Foraging-8x8-2p-2f-coop-v3] [--steps 100000] [--world-sizes 1 2]
        [--num-envs 1 8] [--peer-envs 1 8] [--weak-scaling] [--skip-epymarl | --skip-ddprl] [--ddprl-extra K=V ...]
        speed, no evaluation: env steps/s and updates/s from 10 % of --steps to the end; ddprl's 32 episodes an
        update split over the ranks (--weak-scaling: 32 a rank); --repeats rotate the rows, medians kept
    python benchmarks/qmix_speed.py --learning [--steps 200000] [--eval-freq 50000] [--eval-episodes 100]
        greedy team return every --eval-freq: EPyMARL (1 env), ddprl with its settings (1 rank x 8 envs,
        ``standardise_state=false bootstrap_truncated=false``: its targets), ddprl's defaults (2 ranks x 4 envs)
"""

from __future__ import annotations

import json
import subprocess
import sys
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
SHARED = [
    (k.split(":")[0], k.split(":")[-1], v)
    for k, v in (
        kv.split("=")
        for kv in """batch_size=32 buffer_size=5000
    lr=0.0005 gamma=0.99 target_update_interval:target_update_interval_or_tau=200 epsilon_start=1.0 epsilon_finish=0.05
    epsilon_anneal_steps:epsilon_anneal_time=50000 use_rnn=False hidden_dim=64 obs_agent_id=True obs_last_action=False
    double_q=True standardise_rewards=True mixer=qmix mixing_embed_dim=32 hypernet_layers=2 hypernet_embed=64
    max_grad_norm:grad_norm_clip=10""".split()
    )
]


def task_spec(task: str) -> tuple[str, int]:
    """EPyMARL's gymma key and the episode limit of an LBF, RWARE or MPE task."""
    for prefix, key, limit in (("Foraging", "lbforaging:", 50), ("rware", "rware:", 500), ("simple_", "pz-mpe-", 25)):
        if task.startswith(prefix):
            return key + (task.replace("_", "-") if prefix == "simple_" else task), limit
    raise SystemExit(f"--task {task}: an LBF (Foraging-...), RWARE (rware-...) or MPE (simple_...) task")


def _ddprl_value(value: str) -> str:
    return value.lower() if value in ("True", "False") else value


def epymarl_argv(args, *more: str) -> list[str]:
    """EPyMARL's QMIX on ``args.task`` through the probe (``more``: test and runner keys), then SHARED."""
    key, limit = task_spec(args.task)
    cmd = [args.epymarl_python, str(PROBE), args.epymarl, "--config=qmix", "--env-config=gymma", "with"]
    cmd += [f"env_args.key={key}", f"env_args.time_limit={limit}", f"t_max={args.steps}", f"seed={args.seed}"]
    cmd += ["use_cuda=False", "save_model=False", "use_tensorboard=False", "use_wandb=False", "common_reward=True"]
    return cmd + list(more) + [f"{peer}={value}" for _, peer, value in SHARED]


def run_probe(args, cmd: list[str], tmp: Path) -> tuple[dict, dict]:
    """EPyMARL under the probe, its sacred output in ``tmp``: the probe's record, and :func:`harness.run`'s."""
    out = {"EPYMARL_PROBE_OUT": str(tmp / "probe.json"), "EPYMARL_PROBE_SACRED_DIR": str(tmp / "sacred")}
    run = h.run(cmd, env={**h.ONE_THREAD, **out}, cwd=args.epymarl, timeout=args.timeout)
    return json.loads((tmp / "probe.json").read_text()), run


def ddprl_train(args, world_size: int, num_envs: int, tmp: Path, *keys: str, evals=(0, 0)) -> dict:
    """ddprl's QMIX on ``args.task``, ``keys`` after the common ones."""
    common = f"algo=qmix task={args.task} steps={args.steps} world_size={world_size} num_envs={num_envs} "
    common += f"seed={args.seed} eval_freq={evals[0]} eval_episodes={evals[1]} checkpoint_freq=0 progress=false"
    limit = f"env_kwargs.time_limit={task_spec(args.task)[1]}"
    log = f"log_freq={args.eval_freq if args.learning else max(1, min(10_000, args.steps // 10))}"
    return h.train([*common.split(), limit, log, *keys], tmp / "run", env=h.ONE_THREAD, timeout=args.timeout)


def window(records: list[tuple], skip: float) -> dict:
    """Rates over (seconds, env steps, updates, seconds not training so far) from the first record past ``skip``."""
    first = min(next((i for i, r in enumerate(records) if r[1] >= skip), len(records)), len(records) - 2)
    (t0, s0, u0, x0), (t1, s1, u1, x1) = records[first], records[-1]
    seconds = (t1 - t0) - (x1 - x0)
    return {"fps": (s1 - s0) / seconds, "ups": (u1 - u0) / seconds, "steps": s1}


def speed_epymarl(args, envs: int, tmp: Path) -> dict:
    """EPyMARL's one greedy test (test_nepisode=envs, its minimum) comes right after its first episode, never again."""
    runner = ["runner=parallel", f"batch_size_run={envs}"] if envs > 1 else []
    cmd = epymarl_argv(args, f"test_nepisode={envs}", f"test_interval={10 * args.steps + 1}", *runner)
    probe, run = run_probe(args, cmd, tmp)
    records = [(t, steps, updates, test_s) for t, steps, updates, _, test_s, _ in probe["calls"]]
    return {**window(records, 0.1 * args.steps), "wall": run["wall"], "other": run["other"], "envs": envs}


def speed_ddprl(args, n: int, envs: int, tmp: Path) -> dict:
    keys = [f"{ours}={_ddprl_value(value)}" for ours, _, value in SHARED] + [f"batch_size={32 // n}"]
    keys[-1] = f"update_every={task_spec(args.task)[1] * n}" if args.weak_scaling else keys[-1]  # 32 a rank
    run = ddprl_train(args, n, envs * n, tmp, *keys, *args.ddprl_extra)
    rows = [r for r in run["rows"] if "wall_time" in r]
    records = [(r["wall_time"], r["step"], r.get("train/updates", float("nan")), 0.0) for r in rows]
    speed = {**window(records, 0.1 * args.steps), "wall": run["wall"], "other": run["other"]}
    return {**speed, "world_size": n, "envs": envs}


def epymarl_command(args) -> list[str]:
    """EPyMARL's QMIX on ``args.task``, a greedy test of ``args.eval_episodes`` every ``args.eval_freq``."""
    tests = [f"test_nepisode={args.eval_episodes}", f"test_interval={args.eval_freq}", f"log_interval={args.eval_freq}"]
    return epymarl_argv(args, *tests)


def epymarl_tests(sacred_dir: Path) -> dict[int, float]:
    """``{t_env: mean return}`` of every greedy test, from sacred's ``info.json`` (its console's lags: a mean of 5)."""
    infos = list(sacred_dir.rglob("info.json"))
    if len(infos) != 1:
        raise RuntimeError(f"expected one sacred info.json under {sacred_dir}, found {len(infos)}")
    info = json.loads(infos[0].read_text())
    values = [v["value"] if isinstance(v, dict) else v for v in info.get("test_return_mean", [])]  # jsonpickled
    return {int(t): float(v) for t, v in zip(info.get("test_return_mean_T", []), values, strict=True)}


def grid_step(step: int, every: int) -> int:
    """EPyMARL tests at the first ``t_env`` past each interval, drifting by up to an episode a test: the nearest
    multiple of ``every``."""
    return round(step / every) * every


def run_epymarl(args, tmp: Path) -> tuple[dict[int, float], float]:
    """EPyMARL (``epymarl_command``): its tests by ``t_env``, and its wall seconds."""
    wall = run_probe(args, epymarl_command(args), tmp)[1]["wall"]
    return epymarl_tests(tmp / "sacred"), wall


def learn_ddprl(args, world_size: int, num_envs: int, keys: list[str], tmp: Path) -> tuple[dict[int, float], float]:
    run = ddprl_train(args, world_size, num_envs, tmp, *keys, evals=(args.eval_freq, args.eval_episodes))
    return {int(r["step"]): r["eval/return_mean"] for r in run["rows"] if "eval/return_mean" in r}, run["wall"]


def learning(args) -> tuple[list, list]:
    like = [f"{ours}={_ddprl_value(value)}" for ours, _, value in SHARED]
    like += ["standardise_state=false", "bootstrap_truncated=false"]
    plan = {} if args.skip_epymarl else {"EPyMARL (1 env)": lambda: h.in_tmp(run_epymarl, args)}
    plan["ddprl EPyMARL-like, 1 rank x 8 envs"] = lambda: h.in_tmp(learn_ddprl, args, 1, 8, like)
    plan["ddprl defaults, 2 ranks x 4 envs"] = lambda: h.in_tmp(learn_ddprl, args, 2, 8, [])
    rows = []
    for name, run in plan.items():
        try:
            curve, wall = run()
        except RuntimeError as e:
            print(f"{name}: failed: {e}", flush=True)
            continue
        grid = {grid_step(step, args.eval_freq): value for step, value in curve.items()}
        rows.append([name, *(f"{grid[s]:.2f}" if s in grid else "-" for s in steps(args)), f"{wall:.0f}"])
        print(f"{name}: {curve} ({wall:.0f} s)", flush=True)
    return ["row", *(f"{s // 1000}k" for s in steps(args)), "wall s"], rows


def steps(args) -> range:
    return range(args.eval_freq, args.steps + 1, args.eval_freq)


def epymarl_commit(tree: str) -> str:
    """The EPyMARL tree's git HEAD, else a COMMIT file beside src/ (an exported tree)."""
    head = subprocess.run(["git", "-C", tree, "rev-parse", "HEAD"], capture_output=True, text=True)
    path = Path(tree) / "COMMIT"
    return head.stdout.strip() or (path.read_text().split()[0] if path.exists() else "unknown")


def versions(python: str) -> str:
    return h.versions(python, PACKAGES)


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--task", default="Foraging-8x8-2p-2f-coop-v3", help="an LBF, RWARE or MPE task")
    p.add_argument("--steps", type=int, help="env steps per row, all envs and ranks (100,000; --learning: 200,000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2], help="ddprl world sizes")
    p.add_argument("--num-envs", type=int, nargs="*", default=[1, 8], help="ddprl envs per rank")
    p.add_argument("--peer-envs", type=int, nargs="*", default=[1], help="EPyMARL: 1 episode runner, E parallel")
    p.add_argument("--repeats", type=int, default=1, help="runs of every row, rotated (medians)")
    p.add_argument("--weak-scaling", action="store_true", help="ddprl: 32 episodes an update per rank")
    p.add_argument("--skip-ddprl", action="store_true")
    p.add_argument("--ddprl-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more keys for the ddprl rows")
    p.add_argument("--max-other", type=float, default=0.2, help="a run while others used more cores is redone")
    p.add_argument("--retries", type=int, default=1, help="redos of a contended run (the least contended kept)")
    p.add_argument("--learning", action="store_true", help="the learning curves instead")
    p.add_argument("--eval-freq", type=int, default=50_000, help="--learning: env steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=100, help="--learning: greedy episodes an evaluation")
    p.add_argument("--epymarl", default="/work/peers/epymarl", help="EPyMARL's tree (holds src/main.py)")
    p.add_argument("--epymarl-python", default="/work/peers/epymarl-venv/bin/python", help=f"made by: {EPYMARL_VENV}")
    p.add_argument("--skip-epymarl", action="store_true")
    p.add_argument("--timeout", type=float, help="seconds per run")
    args = p.parse_args()
    args.steps = args.steps or (200_000 if args.learning else 100_000)
    found = Path(args.epymarl, "src", "main.py").is_file() and Path(args.epymarl_python).exists()
    if not (args.skip_epymarl or found):
        p.error(f"no EPyMARL at --epymarl {args.epymarl} or --epymarl-python {args.epymarl_python}; or --skip-epymarl")
    head, rows = (learning if args.learning else speed)(args)

    def report() -> None:
        what = "greedy return" if args.learning else "training speed"
        print(f"### QMIX {what} on {args.task}, {args.steps:,} env steps, seed {args.seed}\n\n{h.machine()}")
        print(f"ddprl: {versions(sys.executable)}")
        if not args.skip_epymarl:
            print(f"EPyMARL {epymarl_commit(args.epymarl)}: {versions(args.epymarl_python)}")
        print("Shared: " + ", ".join(f"{ours}={_ddprl_value(v)}" for ours, _, v in SHARED) + "\n")
        h.table(head, rows)

    h.report(report, args.report)


def speed(args) -> tuple[list, list]:
    plan = {}
    for e in [] if args.skip_epymarl else args.peer_envs:
        name = "EPyMARL episode runner (1 env)" if e == 1 else f"EPyMARL parallel runner ({e} envs)"
        plan[name] = lambda r, e=e: h.in_tmp(speed_epymarl, args, e)
    for e in [] if args.skip_ddprl else args.num_envs:
        for n in args.world_sizes:
            plan[f"ddprl {n} rank(s) x {e} env(s)"] = lambda r, n=n, e=e: h.in_tmp(speed_ddprl, args, n, e)
    runs, table = h.alternate(plan, args.repeats, max_other=args.max_other, retries=args.retries), []
    rows = {name: h.middle(rs, "fps") for name, rs in runs.items()}
    for name, row in rows.items():  # medians of each
        row |= {k: h.median(r.get(k, float("nan")) for r in runs[name]) for k in ("fps", "ups", "wall", "other")}
    base = rows.get("EPyMARL episode runner (1 env)", {})
    one = {r["envs"]: r["fps"] for r in rows.values() if r.get("world_size") == 1}
    for name, r in rows.items():
        if "error" in r:
            table.append([name, "failed: " + r["error"].splitlines()[0]])
            continue
        vs = f"{r['fps'] / base['fps']:.2f}x" if "fps" in base else "-"
        eff = "-"
        if r.get("world_size", 1) > 1 and r["envs"] in one:
            eff = f"{r['fps'] / (r['world_size'] * one[r['envs']]):.0%}"
        name += "*" * any(x.get("other", 0) > args.max_other for x in runs[name])  # contended
        table.append([name, f"{r['fps']:,.0f}", f"{r['ups']:,.1f}", vs, eff, f"{r['wall']:.0f}", f"{r['other']:.2f}"])
    return ["row", "env steps/s", "updates/s", "vs EPyMARL", "scaling eff.", "wall s", "other cores"], table


if __name__ == "__main__":
    main()
