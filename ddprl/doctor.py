"""``ddprl doctor``: verify the distributed set-up before a long job does.

Prints what this machine sees (torch, devices, backend choice), then across ``world_size``
processes: an all_reduce correctness check (every rank contributes rank+1; the sum must be
N(N+1)/2 everywhere), the latency of a small all_reduce and the bandwidth of a large one (bus
bandwidth, as nccl-tests define it): the two inputs of docs/scaling.md's model.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ddprl.config.schema import JobConfig
    from ddprl.runtime.collectives import Runtime


def describe_machine(cfg: JobConfig) -> str:
    lines = [
        f"torch {torch.__version__}  cuda available: {torch.cuda.is_available()}  "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
    ]
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f"  cuda:{i} {props.name} {props.total_memory / 2**30:.1f} GiB")
    lines.append(f"cpu cores: {os.cpu_count()}  world_size={cfg.world_size} device={cfg.device} backend={cfg.backend}")
    return "\n".join(lines)


def doctor(rt: Runtime, cfg: JobConfig, size_mb: float = 64.0) -> None:
    """Collective: check all_reduce results and time it; rank 0 prints a report."""
    if rt.is_main:
        print(f"backend chosen: {rt.backend}  world_size: {rt.world_size}  rank 0 device: {rt.device}", flush=True)
    devices = rt.all_gather_object(str(rt.device))
    # Correctness: a tiny, exact sum every rank can check.
    value = torch.full((4,), float(rt.rank + 1), device=rt.device)
    total = rt.all_reduce_sum(value)
    expected = rt.world_size * (rt.world_size + 1) / 2
    ok = bool(torch.all(total == expected))
    all_ok = rt.all_gather_object(ok)
    # Latency: a small all_reduce, what a metrics dict or a small gradient costs a call.
    small = torch.ones(8, device=rt.device)
    latencies = []
    for _ in range(200):
        rt.barrier()
        start = time.perf_counter()
        float(rt.all_reduce_sum(small)[0])  # its value: the collective has finished
        latencies.append(time.perf_counter() - start)
    latency = max(rt.all_gather_object(statistics.median(latencies)))
    # Bandwidth: time all_reduce of a float32 buffer of size_mb MB.
    numel = int(size_mb * 2**20 / 4)
    buf = torch.ones(numel, device=rt.device)
    rt.all_reduce_sum(buf)  # warm-up (connection set-up)
    rt.barrier()
    iters = 5
    t0 = time.perf_counter()
    for _ in range(iters):
        rt.all_reduce_sum(buf)
    if rt.device.type == "cuda":
        torch.cuda.synchronize(rt.device)
    seconds = (time.perf_counter() - t0) / iters
    slowest = max(rt.all_gather_object(seconds))
    if rt.is_main:
        size_gb = numel * 4 / 1e9
        n = rt.world_size
        algbw = size_gb / slowest
        busbw = algbw * (2 * (n - 1) / n) if n > 1 else 0.0
        print(f"ranks' devices: {', '.join(devices)}")
        print(f"all_reduce correctness: {'OK' if all(all_ok) else 'FAILED'} (expected {expected:g} on every rank)")
        print(f"collectives: {rt.collectives}; all_reduce latency (32 B): {latency * 1e6:.0f} us (median of 200)")
        print(
            f"all_reduce {numel * 4 / 2**20:.0f} MiB: {slowest * 1e3:.1f} ms, "
            f"algbw {algbw:.2f} GB/s, busbw {busbw:.2f} GB/s"
        )
        print("doctor: OK" if all(all_ok) else "doctor: FAILED", flush=True)
    if not all(all_ok):
        raise RuntimeError("all_reduce returned wrong sums: the process group is broken")
