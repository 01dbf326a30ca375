"""The gradient all-reduce of an eager (compile=false) update: torch's functional collective,
the in-place gloo ``dist.all_reduce``, and the shared-memory all-reduce that ``Runtime`` uses
between the CPU ranks of one machine (``ddprl.runtime.shm``).

Two gloo ranks on this machine; each repetition times one of each on the same flat tensor
(the size of PPO's default actor-critic gradient), interleaved, so that a load on the machine
weighs on both alike. Prints the median and the mean of each in milliseconds.

    python benchmarks/allreduce_eager.py [--numel 9000] [--reps 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import cpu_model

from ddprl.runtime import shm
from ddprl.runtime.compat import functional_all_reduce


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    float(fn()[0])  # the value itself: the collective has finished
    return time.perf_counter() - start


def rank_main(rank: int, port: int, numel: int, reps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    grad = torch.randn(numel)
    path = [shm.create_file(2) if rank == 0 else None]
    dist.broadcast_object_list(path)
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    group = shm.SharedMemoryGroup(path[0], rank, 2, timeout_s=60, pids=pids)
    dist.barrier()
    if rank == 0:
        os.unlink(path[0])

    def functional() -> torch.Tensor:
        return functional_all_reduce(grad, "sum", dist.group.WORLD) / 2

    def in_place() -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total / 2

    def shared_memory() -> torch.Tensor:
        return group.all_reduce_sum_(grad.clone()) / 2

    times: dict[str, list[float]] = {"functional": [], "in place": [], "shared memory": []}
    for _ in range(reps):
        times["functional"].append(timed(functional))
        times["in place"].append(timed(in_place))
        times["shared memory"].append(timed(shared_memory))
    if rank == 0:
        print(f"{cpu_model()}; 2 gloo ranks, {numel} floats, {reps} interleaved repetitions")
        for name, values in times.items():
            median, mean = statistics.median(values) * 1e3, statistics.mean(values) * 1e3
            print(f"{name:13s} median {median:.3f} ms, mean {mean:.3f} ms")
    group.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=9000)
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(port, args.numel, args.reps), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
