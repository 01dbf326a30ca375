"""A scaling model for ddprl's data-parallel algorithms: predicted weak-scaling efficiency at
8, 64 and 512 GPUs from what one rank measures, and the interconnect.

    python benchmarks/scaling_model.py                            # the table of docs/scaling.md
    python benchmarks/scaling_model.py --latency-us 25 --busbw-gbs 40 --ranks 16   # your doctor's figures

Weak scaling (each rank keeps its envs and batch): one rank spends ``iteration_s`` an iteration,
``allreduces`` of them on the gradient (S bytes, float32). N ranks add, per all-reduce, the
time of a ring all-reduce:

    t(N, S) = latency(N) + 2 (N - 1) / N * S / busbw          (nccl-tests' bus bandwidth)
    efficiency(N) = iteration_s / (iteration_s + allreduces * t(N, S))

Left out, so the model is an upper bound: the wait for the slowest rank (jitter; the 2-rank
runs of benchmarks/scaling.py measure it), the small metric reductions (one or two an
iteration), and any overlap of the all-reduce with the backward pass (which only helps).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

# Public figures (docs/scaling.md cites them). The latencies are assumptions of the order NCCL
# shows for small all-reduces; `ddprl doctor` measures yours.
NVLINK_BUSBW = 450e9  # H100/H200 SXM: NVLink 4, 900 GB/s both directions per GPU (NVIDIA's datasheet)
IB_BUSBW = 50e9  # NDR InfiniBand, 400 Gb/s per GPU (one ConnectX-7 per GPU, as in a DGX H100)
NVLINK_LATENCY = 20e-6  # assumed: one NVSwitch node
IB_HOP_LATENCY = 10e-6  # assumed: per tree level across nodes


def latency(n: int) -> float:
    """A small all-reduce on ``n`` GPUs, 8 a node: NVLink inside, a tree across nodes."""
    nodes = max(1, n // 8)
    return NVLINK_LATENCY + (IB_HOP_LATENCY * 2 * math.log2(nodes) if nodes > 1 else 0.0)


def busbw(n: int) -> float:
    return NVLINK_BUSBW if n <= 8 else IB_BUSBW


def allreduce_s(n: int, nbytes: float, lat: float | None = None, bw: float | None = None) -> float:
    lat = latency(n) if lat is None else lat
    bw = busbw(n) if bw is None else bw
    return lat + 2 * (n - 1) / n * nbytes / bw


@dataclass(frozen=True)
class Workload:
    name: str
    params: int  # gradient floats all-reduced per update
    allreduces: float  # per iteration
    iteration_s: float  # one rank, measured
    source: str


def efficiency(w: Workload, n: int, lat: float | None = None, bw: float | None = None) -> float:
    comm = w.allreduces * allreduce_s(n, 4 * w.params, lat, bw)
    return w.iteration_s / (w.iteration_s + comm)


# Parameter counts from the networks themselves (CartPole: obs 4, 2 actions; HalfCheetah: obs 17,
# 6 actions; TD-MPC2 on walker-run: obs 24, 6 actions; Snake's CNN of the H100 row).
WORKLOADS = [
    Workload(
        "PPO CartPole, 8 envs, 256 steps, 80 minibatches of 256 (CPU rank)",
        9_155,
        80,
        2048 / 8054,
        "this machine, 2026-12-01 (benchmarks/scaling.py ppo-cartpole, 1 rank: 8,054 steps/s)",
    ),
    Workload(
        "PPO HalfCheetah preset, 8 envs, 320 minibatches of 64 (CPU rank)",
        11_085,
        320,
        2048 / 3173,
        "this machine, 2026-12-01 (benchmarks/scaling.py ppo-halfcheetah, 1 rank: 3,173 steps/s)",
    ),
    Workload(
        "PPO Snake, 65,536 envs, 16 minibatches (one H100)",
        208_917,
        16,
        5.49,
        "docs/benchmarks.md, On one H100: 4,194,304 steps at 763,944 steps/s",
    ),
    Workload(
        "TD-MPC2 model_size 1, compiled (one H100)",
        1_214_651,
        1,
        1 / 118.9,
        "docs/benchmarks.md, On one H100: 118.9 agent steps/s, one update a step",
    ),
    Workload(
        "TD-MPC2 model_size 5, compiled (one H100)",
        4_960_618,
        1,
        1 / 115.9,
        "docs/benchmarks.md, On one H100: 115.9 agent steps/s",
    ),
    Workload(
        "TD-MPC2 model_size 19, compiled (one H100)",
        18_062_442,
        1,
        1 / 68.9,
        "docs/benchmarks.md, On one H100: 68.9 agent steps/s",
    ),
    Workload(
        "TD-MPC2 model_size 317, compiled (one H100, assumed)",
        312_595_417,
        1,
        1 / 68.9 * 312_595_417 / 18_062_442,
        "not measured: size 19's step time scaled by parameters (an assumption)",
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--latency-us", type=float, help="your small all-reduce latency (ddprl doctor)")
    parser.add_argument("--busbw-gbs", type=float, help="your bus bandwidth in GB/s (ddprl doctor)")
    args = parser.parse_args()
    lat = None if args.latency_us is None else args.latency_us * 1e-6
    bw = None if args.busbw_gbs is None else args.busbw_gbs * 1e9
    link = "the given latency and bandwidth" if lat or bw else "NVLink within 8, InfiniBand NDR beyond"
    print(f"Predicted weak-scaling efficiency ({link}); comm ms per all-reduce in brackets\n")
    print(
        "| workload | gradient | all-reduces / iteration | one rank's iteration | "
        + " | ".join(f"{n} ranks" for n in args.ranks)
        + " |"
    )
    print("|---|---:|---:|---:|" + "---:|" * len(args.ranks))
    for w in WORKLOADS:
        cells = " | ".join(
            f"{efficiency(w, n, lat, bw):.2f} ({1e3 * allreduce_s(n, 4 * w.params, lat, bw):.2f})" for n in args.ranks
        )
        size = 4 * w.params
        grad = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        print(f"| {w.name} | {grad} | {w.allreduces:g} | {1e3 * w.iteration_s:,.1f} ms | {cells} |")
    print()
    for w in WORKLOADS:
        print(f"- {w.name}: {w.source}")


if __name__ == "__main__":
    main()
