"""Distributed overheads on this machine, and beyond it.

python benchmarks/scaling.py [--ranks 1 2 4] [--only ppo-cartpole,qmix-lbf] [--keys cpu_bind=cores] [--out F]
    every algorithm at 1 rank against N, each a real `ddprl train` per world size, alternated (--repeats, the
    median kept); rate: global steps (samples) per second over the rows after a warm-up; weak scaling:
    efficiency = rate(N) / (N x rate(1)); strong: speed-up; to a return: seconds(1) / seconds(N), start-up in
python benchmarks/scaling.py --collectives [--numel 9000] [--reps 2000]
    the eager gradient all-reduce on 2 gloo ranks, interleaved, each after a barrier: torch's functional one,
    the in-place ``dist.all_reduce``, the shared-memory one of CPU ranks (``ddprl.runtime.shm``)
python benchmarks/scaling.py --stop-checks
    rank 0's ``time/stop_check_s`` (the stop-signal collective, waits included) at the end of 2-rank jobs
python benchmarks/scaling.py --model [--latency-us 25 --busbw-gbs 40] [--ranks 8 64 512]
    weak-scaling efficiency predicted from one rank's iteration time T with k all-reduces of S bytes:
    t(N, S) = latency(N) + 2 (N - 1) / N x S / busbw (a ring); efficiency = T / (T + k t(N, S)), an upper bound
"""

from __future__ import annotations

import functools
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness as h

from ddprl.timesplit import PHASES, shares

# name | scaling | warm-up rows | rate: "steps", a metric, or a return (the seconds to it) | the work | ddprl keys
# ("K*n": K times the ranks; an indented line goes on the one above)
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
supervised-digits | weak | 2 | time/samples_per_s | batches of 32 (digits)
    | algo=supervised task=digits epochs=12 batch_size=32
supervised-graph | weak | 1 | time/samples_per_s | batches of 32 graphs (graph_energy)
    | algo=supervised task=graph_energy epochs=4 batch_size=32
jax-ppo | weak | 3 | steps | 16 gymnax CartPole envs per process (one CPU device each)
    | engine=jax task=gymnax/CartPole-v1 num_envs=16*n steps=81920*n
"""
WORKLOADS = {w[0]: w[1:] for w in (line.split(" | ") for line in TABLE.replace("\n    ", " ").strip().splitlines())}


def run_job(name: str, n: int, workdir: Path, timeout: float, extra: list[str]) -> dict:
    """One ``ddprl train``: its rate and time split (mean over ranks) over the rows after warm-up."""
    _, warmup, metric, _, keys = WORKLOADS[name]
    warmup = int(warmup)
    target = float(metric) if metric[0].isdigit() else None
    keys = [*re.sub(r"(\d+)\*n", lambda m: str(int(m[1]) * n), keys).split(), *extra, f"world_size={n}"]
    keys += ["progress=false", "checkpoint_freq=100000000"]
    keys += ["eval_episodes=0"] if target is None and "algo=supervised" not in keys else []
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    env = env if "engine=jax" in keys else {}
    rows = h.train(keys, workdir / f"{name}-{n}", env=env, timeout=timeout)["rows"]
    if target is not None:  # the wall time of the first evaluation at the target
        hit = [r["wall_time"] for r in rows if r.get("eval/return_mean", -math.inf) >= target]
        return {"rate": hit[0] if hit else math.inf, **dict.fromkeys(PHASES, 0.0)}
    kept = [r for r in rows if ("time/global_fps" if metric == "steps" else metric) in r][warmup:]
    if len(kept) < 2:
        raise RuntimeError(f"{name} at {n}: too few rows after warm-up")
    if metric == "steps":
        rate = (kept[-1]["step"] - kept[0]["step"]) / (kept[-1]["wall_time"] - kept[0]["wall_time"])
    else:
        rate = statistics.median(r[metric] for r in kept)
    split = {p: sum(r.get(f"time/{p}_s", 0.0) for r in kept[1:]) for p in PHASES}
    return {"rate": rate, "say": f"{rate:,.2f}", **split}


PROBE = """import time, torch
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
x, y, opt = torch.randn(64, 64), torch.randint(0, 10, (64,)), torch.optim.Adam(net.parameters())
n, end = 0, time.perf_counter() + 4
while time.perf_counter() < end:
    torch.nn.functional.cross_entropy(net(x), y).backward(); opt.step(); opt.zero_grad(); n += 1
print(n / 4)"""


def machine_ceiling(copies: int, rounds: int = 3) -> float:
    """The rate of ``copies`` copies of a small CPU-bound loop together over ``copies`` times one alone (1.0:
    independent cores): no CPU-bound training scales better here. Alternated, median: the machine's speed drifts."""

    def together(k: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True) for _ in range(k)]
        return sum(float(p.communicate()[0]) for p in procs)

    return statistics.median(together(copies) / (copies * together(1)) for _ in range(rounds))


# the stop-signal checks' jobs, 2 ranks each
STOP_JOBS = {
    "PPO CartPole-v1, 2 ranks, 300k steps": "steps=300000 eval_episodes=0",
    "QMIX Foraging-8x8-2p-2f-coop-v3, 2 ranks, 20k steps": "algo=qmix task=Foraging-8x8-2p-2f-coop-v3 steps=20000 "
    "eval_episodes=0",
    "supervised digits, 2 ranks, 60 epochs": "algo=supervised task=digits epochs=60 patience=0",
}
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


def allreduce_s(n: int, nbytes: float, lat: float | None, bw: float | None) -> float:
    nodes = max(1, n // 8)
    lat = NVLINK_LATENCY + (2 * IB_HOP_LATENCY * math.log2(nodes) if nodes > 1 else 0.0) if lat is None else lat
    return lat + 2 * (n - 1) / n * nbytes / (bw or (NVLINK_BUSBW if n <= 8 else IB_BUSBW))


def model(args) -> None:
    lat = None if args.latency_us is None else args.latency_us * 1e-6
    bw = None if args.busbw_gbs is None else args.busbw_gbs * 1e9
    link = "the given latency and bandwidth" if lat or bw else "NVLink within 8, InfiniBand NDR beyond"
    print(f"Predicted weak-scaling efficiency ({link}); ms per all-reduce in brackets\n")
    rows, workloads = [], [line.split(" | ") for line in MODEL.replace("\n    ", " ").strip().splitlines()]
    for name, params, k, seconds, _ in workloads:
        size, t = 4 * int(params), eval(seconds)  # an arithmetic expression of the table above
        comm = [allreduce_s(n, size, lat, bw) for n in args.ranks]
        grad = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        rows.append(
            [name, grad, k, f"{1e3 * t:,.1f} ms", *(f"{t / (t + int(k) * c):.2f} ({1e3 * c:.2f})" for c in comm)]
        )
    head = ["workload", "gradient", "all-reduces / iteration", "one rank's iteration"]
    h.table(head + [f"{n} ranks" for n in args.ranks], rows)
    print("\n" + "\n".join(f"- {w[0]}: {w[4]}" for w in workloads))


def stop_checks(args) -> None:
    rows, load = [], []
    for name, keys in STOP_JOBS.items():
        keys = [*keys.split(), "world_size=2", "device=cpu", "progress=false"]
        try:
            run = h.in_tmp(lambda tmp, keys=keys: h.train(keys, tmp / "run", timeout=args.timeout))
        except RuntimeError as e:
            rows.append([name, f"failed: {str(e).splitlines()[0]}", "", ""])
            continue
        spent, wall, load = run["rows"][-1]["time/stop_check_s"], run["rows"][-1]["wall_time"], [*load, run["other"]]
        rows.append([name, f"{wall:.0f} s", f"{spent * 1e3:.1f} ms", f"{100 * spent / wall:.3f} %"])
    print(f"{h.machine()}, other processes' load up to {max(load, default=0):.2f} cores; 2 gloo ranks\n")
    h.table(["job", "run time", "time in the checks", "share of the run"], rows)


def collective_rank(rank: int, port: int, numel: int, reps: int) -> None:
    import torch
    import torch.distributed as dist

    from ddprl.runtime import shm
    from ddprl.runtime.compat import functional_all_reduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    grad, path, pids = torch.randn(numel), [shm.create_file(2) if rank == 0 else None], [None, None]
    dist.broadcast_object_list(path)
    dist.all_gather_object(pids, os.getpid())
    group = shm.SharedMemoryGroup(path[0], rank, 2, timeout_s=60, pids=pids)
    dist.barrier()
    if rank == 0:
        os.unlink(path[0])
    ways = {
        "gloo, functional": lambda: functional_all_reduce(grad, "sum", dist.group.WORLD) / 2,
        "gloo, in place": lambda: (dist.all_reduce(total := grad.clone()), total / 2)[1],
        "shared memory": lambda: group.all_reduce_sum_(grad.clone()) / 2,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(reps):
        for name, fn in ways.items():
            dist.barrier()
            start = time.perf_counter()
            float(fn()[0])  # the value itself: the collective has finished
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        print(f"{h.cpu_model()}; 2 gloo ranks, {numel} floats, {reps} interleaved repetitions")
        for name, t in times.items():
            print(f"{name:16s} median {statistics.median(t) * 1e3:.3f} ms, mean {statistics.mean(t) * 1e3:.3f} ms")
    group.close()
    dist.destroy_process_group()


def main() -> None:
    p = h.parser(__doc__)
    for mode in ("collectives", "stop-checks", "model"):
        p.add_argument(f"--{mode}", action="store_true", help="the measure of that name above")
    p.add_argument("--ranks", type=int, nargs="+", help="world sizes, the first the base (--model: 8 64 512)")
    p.add_argument("--only", default="", help=f"comma-separated workloads: {', '.join(WORKLOADS)}")
    p.add_argument("--repeats", type=int, default=3, help="runs per world size, alternated; the median is kept")
    p.add_argument("--once", default="tdmpc2,jax-ppo", help="workloads run once whatever --repeats says")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    p.add_argument("--out", dest="report", help="the same as --report")
    p.add_argument("--keys", nargs="*", default=[], help="ddprl keys added to every job (cpu_bind=cores)")
    p.add_argument("--numel", type=int, default=9000, help="--collectives: floats all-reduced")
    p.add_argument("--reps", type=int, default=2000, help="--collectives: repetitions")
    p.add_argument("--latency-us", type=float, help="--model: your small all-reduce latency (ddprl doctor)")
    p.add_argument("--busbw-gbs", type=float, help="--model: your bus bandwidth in GB/s (ddprl doctor)")
    args = p.parse_args()
    args.ranks = args.ranks or ([8, 64, 512] if args.model else [1, 2])
    if args.collectives:
        import torch.multiprocessing as mp

        return mp.start_processes(
            collective_rank, (h.free_port(), args.numel, args.reps), nprocs=2, start_method="spawn"
        )
    if args.model or args.stop_checks:
        return h.report(lambda: (model if args.model else stop_checks)(args), args.report)
    chosen = [w for w in WORKLOADS if not args.only or w in args.only.split(",")]
    if not chosen:
        raise SystemExit(f"--only {args.only}: no such workload")
    ceilings = ", ".join(f"{n} processes {machine_ceiling(n):.2f}" for n in args.ranks if n > 1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in chosen:
            job = lambda r, n, w=w: run_job(w, n, Path(tmp) / f"r{r}", args.timeout, args.keys)  # noqa: E731
            plan = {n: functools.partial(job, n=n) for n in args.ranks}
            runs = h.alternate(plan, 1 if w in args.once.split(",") else args.repeats, rotate=False)
            results[w] = {n: h.middle(rs, "rate") for n, rs in runs.items()}

    def report() -> None:
        base, top = args.ranks[0], args.ranks[-1]
        print(f"Machine: {h.machine()}; {time.strftime('%Y-%m-%d')}; ranks {args.ranks}")
        print(f"Machine ceiling (N busy processes' rate / N x one alone): {ceilings}\n")
        rows = []
        for w in chosen:
            (scaling, _, metric, what, _), res = WORKLOADS[w], results[w]
            if any("error" in res[n] for n in args.ranks):
                rows.append([w, scaling, what, *("failed" for _ in args.ranks), "", ""])
                continue
            rates = [f"{res[n]['rate']:,.{2 if res[n]['rate'] < 100 else 0}f}" for n in args.ranks]
            speedup = res[top]["rate"] / res[base]["rate"]
            if metric[0].isdigit():  # seconds
                score = f"{1 / speedup:.2f}x"
            else:
                score = f"{speedup:.2f}x" if scaling == "strong" else f"{speedup * base / top:.2f}"
            rows.append([w, scaling, what, *rates, score, shares({p: res[top][p] for p in PHASES}, at_least=0.05)])
        ranks = [f"{n} rank{'s' if n > 1 else ''}" for n in args.ranks]
        h.table(["workload", "scaling", "work", *ranks, "efficiency / speed-up", f"where {top} ranks spend it"], rows)

    h.report(report, args.report)


if __name__ == "__main__":
    main()
