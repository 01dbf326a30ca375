"""Distributed overheads on this machine, and beyond it.

python benchmarks/scaling.py [--ranks 1 2 4] [--only ppo-cartpole,qmix-lbf] [--keys cpu_bind=cores]
    every algorithm at 1 rank against N, each a real `ddprl train` per world size (the JAX engine: one process of N
    CPU devices), alternated (--repeats, the median kept); rate: global steps (samples) per second over the rows
    after a warm-up; weak scaling: efficiency = rate(N) / (N x rate(1)); strong: speed-up; to a return: seconds(1) /
    seconds(N), start-up in; --ceiling adds, for each weak workload but the JAX one, N 1-rank jobs at once: their summed
    rate over N x rate(1) is what N processes give that workload here with no collective, its own ceiling
python benchmarks/scaling.py --model [--latency-us 25 --busbw-gbs 40] [--ranks 8 64 512]
    weak-scaling efficiency predicted from one rank's iteration time T with k all-reduces of S bytes:
    t(N, S) = latency(N) + 2 (N - 1) / N x S / busbw (a ring); efficiency = T / (T + k t(N, S)), an upper bound
"""

from __future__ import annotations

import functools
import math
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import harness as h

from ddprl.timesplit import PHASES, shares

# name | scaling | warm-up rows | rate: "steps", a metric, or a return (the seconds to it) | the work | ddprl keys
# ("K*n": K times the ranks; an indented line goes on the one above). Weak scaling keeps each rank's work: the same
# steps a rank, and a supervised run's epochs times the ranks (each rank's shard is 1/N of the data), warm-up alike.
TABLE = """
ppo-default | strong | 3 | steps | 8 CartPole envs in all (`ddprl train`) | steps=61440
ppo-default-target | strong | 0 | 475 | `ddprl train` to eval return 475, seconds | eval_freq=8192 eval_episodes=10
ppo-cartpole | weak | 3 | steps | 8 CartPole envs, 256 steps each | num_envs=8*n steps=61440*n
ppo-halfcheetah | weak | 2 | steps | HalfCheetah preset, 8 envs x 256 steps
    | task=HalfCheetah-v5 num_envs=8*n n_steps=256 steps=24576*n
qmix-lbf | weak | 3 | steps | 8 LBF envs, 32 episodes an update | algo=qmix task=Foraging-8x8-2p-2f-coop-v3
    num_envs=8*n steps=60000*n log_freq=4000*n update_every=50*n epsilon_anneal_steps=1000
tdmpc2 | weak | 4 | steps | 1 walker-run env, model_size 1 | algo=tdmpc2 task=walker-run model_size=1
    episode_length=50 seed_steps=50*n log_freq=20*n steps=250*n buffer_size=10000
supervised-digits | weak | 2*n | time/samples_per_s | batches of 32 (digits)
    | algo=supervised task=digits epochs=12*n batch_size=32
supervised-graph | weak | 1*n | time/samples_per_s | batches of 32 graphs (graph_energy)
    | algo=supervised task=graph_energy epochs=4*n batch_size=32
jax-ppo | weak | 3 | steps | 16 gymnax CartPole envs per CPU device, one process
    | engine=jax task=gymnax/CartPole-v1 num_envs=16*n steps=81920*n
"""
# the model's workloads: name | gradient floats | all-reduces an iteration | one rank's iteration s | where T comes from
MODEL = """
PPO CartPole, 8 envs, 256 steps, 80 minibatches of 256 (CPU rank) | 9155 | 80 | 2048 / 8054
    | benchmarks/scaling.py ppo-cartpole, 1 rank: 8,054 steps/s (2026-12-01)
PPO HalfCheetah preset, 8 envs, 320 minibatches of 64 (CPU rank) | 11085 | 320 | 2048 / 3173
    | benchmarks/scaling.py ppo-halfcheetah, 1 rank: 3,173 steps/s (2026-12-01)
PPO Snake, 65,536 envs, 16 minibatches (one H100) | 208917 | 16 | 5.49
    | docs/benchmarks.md, On one H100: 4,194,304 steps at 763,944 steps/s
TD-MPC2 model_size 1, compiled (one H100) | 1214651 | 1 | 1 / 118.9 | docs/benchmarks.md, On one H100: 118.9 steps/s
TD-MPC2 model_size 5, compiled (one H100) | 4960618 | 1 | 1 / 115.9 | docs/benchmarks.md, On one H100: 115.9 steps/s
TD-MPC2 model_size 19, compiled (one H100) | 18062442 | 1 | 1 / 68.9 | docs/benchmarks.md, On one H100: 68.9 steps/s
TD-MPC2 model_size 317, compiled (one H100, assumed) | 312595417 | 1 | 1 / 68.9 * 312595417 / 18062442
    | not measured: size 19's step time scaled by parameters (an assumption)
"""
NVLINK_BUSBW, IB_BUSBW = 450e9, 50e9  # NVLink 4 within an 8-GPU node; NDR InfiniBand per GPU beyond (datasheets)
NVLINK_LATENCY, IB_HOP_LATENCY = 20e-6, 10e-6  # assumed: one NVSwitch node; per tree level across nodes
# a small CPU-bound training loop, 4 s: its steps per second
PROBE = """import time, torch
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
x, y, opt = torch.randn(64, 64), torch.randint(0, 10, (64,)), torch.optim.Adam(net.parameters())
n, end = 0, time.perf_counter() + 4
while time.perf_counter() < end:
    torch.nn.functional.cross_entropy(net(x), y).backward(); opt.step(); opt.zero_grad(); n += 1
print(n / 4)"""


def table(text: str) -> list[list[str]]:
    """The rows of TABLE or MODEL: " | "-separated cells, an indented line continuing the one above."""
    return [line.split(" | ") for line in text.replace("\n    ", " ").strip().splitlines()]


WORKLOADS = {w[0]: w[1:] for w in table(TABLE)}


def run_job(name: str, n: int, timeout: float, extra: list[str]) -> dict:
    """One ``ddprl train``: its rate and time split (mean over ranks) over the rows after warm-up."""
    _, warmup, metric, _, keys = WORKLOADS[name]
    target = float(metric) if metric[0].isdigit() else None
    times_n = functools.partial(re.sub, r"(\d+)\*n", lambda m: str(int(m[1]) * n))
    keys, warmup = times_n(keys).split(), int(times_n(warmup))
    jax_engine = "engine=jax" in keys  # its layout on one machine: one process driving n devices
    keys += [*extra, f"devices={n}" if jax_engine else f"world_size={n}", "progress=false", "checkpoint_freq=100000000"]
    keys += ["eval_episodes=0"] if target is None and "algo=supervised" not in keys else []
    rows = h.train(keys, env=h.jax_cpu(n) if jax_engine else {}, timeout=timeout)["rows"]
    if target is not None:  # the wall time of the first evaluation at the target
        hit = [r["wall_time"] for r in rows if r.get("eval/return_mean", -math.inf) >= target]
        return {"rate": hit[0] if hit else math.inf, **dict.fromkeys(PHASES, 0.0)}
    kept = [r for r in rows if ("time/global_fps" if metric == "steps" else metric) in r][warmup:]
    if len(kept) < 2:
        raise RuntimeError(f"{name} at {n}: too few rows after warm-up")
    steps = (kept[-1]["step"] - kept[0]["step"]) / (kept[-1]["wall_time"] - kept[0]["wall_time"])
    rate = steps if metric == "steps" else statistics.median(r[metric] for r in kept)
    split = {p: sum(r.get(f"time/{p}_s", 0.0) for r in kept[1:]) for p in PHASES}
    return {"rate": rate, "say": f"{rate:,.2f}", **split}


def independent_jobs(name: str, n: int, timeout: float, extra: list[str]) -> dict:
    """``n`` 1-rank jobs of workload ``name`` started together: their summed rate (the workload's own ceiling)."""
    with ThreadPoolExecutor(n) as pool:
        jobs = list(pool.map(lambda _: run_job(name, 1, timeout, extra), range(n)))
    return {"rate": sum(job["rate"] for job in jobs), **{p: statistics.mean(job[p] for job in jobs) for p in PHASES}}


def machine_ceiling(copies: int, rounds: int = 3) -> float:
    """The rate of ``copies`` copies of PROBE together over ``copies`` times one alone (1.0: independent cores): no
    CPU-bound training scales better here. Alternated, median: the machine's speed drifts."""

    def together(k: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True) for _ in range(k)]
        return sum(float(p.communicate()[0]) for p in procs)

    return statistics.median(together(copies) / (copies * together(1)) for _ in range(rounds))


def scaling(args) -> None:
    chosen = [w for w in WORKLOADS if not args.only or w in args.only.split(",")]
    if not chosen:
        raise SystemExit(f"--only {args.only}: no such workload")
    ceilings = ", ".join(f"{n} processes {machine_ceiling(n):.2f}" for n in args.ranks if n > 1)
    base, top, rows = args.ranks[0], args.ranks[-1], []
    for w in chosen:
        plan = {n: lambda r, n=n, w=w: run_job(w, n, args.timeout, args.keys) for n in args.ranks}
        (kind, _, metric, what, keys), alone = WORKLOADS[w], f"{top} x 1"
        if args.ceiling and kind == "weak" and "engine=jax" not in keys and base == 1 < top:
            plan[alone] = lambda r, w=w: independent_jobs(w, top, args.timeout, args.keys)
        runs = h.alternate(plan, 1 if w in args.once.split(",") else args.repeats, rotate=False)
        res = {n: h.middle(rs, "rate") for n, rs in runs.items()}
        if any("error" in r for r in res.values()):
            rows.append([w, kind, what, *("failed" for _ in args.ranks), "", *[""] * args.ceiling, ""])
            continue
        rates = [f"{res[n]['rate']:,.{2 if res[n]['rate'] < 100 else 0}f}" for n in args.ranks]
        speedup = res[top]["rate"] / res[base]["rate"]
        score = f"{speedup:.2f}x" if kind == "strong" else f"{speedup * base / top:.2f}"
        score = f"{1 / speedup:.2f}x" if metric[0].isdigit() else score  # seconds
        own = [f"{res[alone]['rate'] / (top * res[base]['rate']):.2f}" if alone in res else ""] * args.ceiling
        rows.append([w, kind, what, *rates, score, *own, shares({p: res[top][p] for p in PHASES}, at_least=0.05)])
    print(f"Machine: {h.machine()}; {time.strftime('%Y-%m-%d')}; ranks {args.ranks}")
    print(f"Machine ceiling (N busy processes' rate / N x one alone): {ceilings}\n")
    ranks = [f"{n} rank{'s' if n > 1 else ''}" for n in args.ranks]
    own = [f"its ceiling ({top} 1-rank jobs at once)"] * args.ceiling
    h.table(["workload", "scaling", "work", *ranks, "efficiency / speed-up", *own, f"where {top} ranks spend it"], rows)


def model(args) -> None:
    lat = None if args.latency_us is None else args.latency_us * 1e-6
    bw = None if args.busbw_gbs is None else args.busbw_gbs * 1e9
    link = "the given latency and bandwidth" if lat or bw else "NVLink within 8, InfiniBand NDR beyond"
    print(f"Predicted weak-scaling efficiency ({link}); ms per all-reduce in brackets\n")
    rows = []
    for name, params, k, seconds, _ in table(MODEL):
        size, t, comm = 4 * int(params), eval(seconds), []  # an arithmetic expression of the table above
        for n in args.ranks:  # a ring all-reduce: NVLink within a node of 8, then InfiniBand across a tree of nodes
            nodes = max(1, n // 8)
            latency = NVLINK_LATENCY + 2 * IB_HOP_LATENCY * math.log2(nodes) if lat is None else lat
            comm.append(latency + 2 * (n - 1) / n * size / (bw or (NVLINK_BUSBW if n <= 8 else IB_BUSBW)))
        grad = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        cells = [f"{t / (t + int(k) * c):.2f} ({1e3 * c:.2f})" for c in comm]
        rows.append([name, grad, k, f"{1e3 * t:,.1f} ms", *cells])
    head = ["workload", "gradient", "all-reduces / iteration", "one rank's iteration"]
    h.table(head + [f"{n} ranks" for n in args.ranks], rows)
    print("\n" + "\n".join(f"- {w[0]}: {w[4]}" for w in table(MODEL)))


def main() -> None:
    p = h.parser(__doc__, repeats=3)
    p.add_argument("--model", action="store_true", help="the predicted efficiency above")
    p.add_argument("--ranks", type=int, nargs="+", help="world sizes, the first the base (--model: 8 64 512)")
    p.add_argument("--only", default="", help=f"comma-separated workloads: {', '.join(WORKLOADS)}")
    p.add_argument("--once", default="tdmpc2,jax-ppo", help="workloads run once whatever --repeats says")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    p.add_argument("--ceiling", action="store_true", help="also N 1-rank jobs at once: each workload's own ceiling")
    p.add_argument("--keys", nargs="*", default=[], help="ddprl keys added to every job (cpu_bind=cores)")
    p.add_argument("--latency-us", type=float, help="--model: your small all-reduce latency (ddprl doctor)")
    p.add_argument("--busbw-gbs", type=float, help="--model: your bus bandwidth in GB/s (ddprl doctor)")
    args = p.parse_args()
    args.ranks = args.ranks or ([8, 64, 512] if args.model else [1, 2])
    (model if args.model else scaling)(args)


if __name__ == "__main__":
    main()
