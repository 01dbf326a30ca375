"""How far each phase of a PPO run is from the hardware's limit: achieved FLOP/s of act and learn against the peak
of one core (or the GPU), fp32 and bf16, with the environment's share of the time beside them.

The peak is computed, not measured: cores x clock x FLOP per cycle, from the CPU's flags (/proc/cpuinfo: AVX-512 or
AVX2 FMA units for fp32; AVX512_BF16 or AMX for bf16) or from the GPU's model (its datasheet's dense numbers). A
virtual machine reports its base clock, so a core that boosts above it can show more than 100 %. Beside it, the
ceiling a large matrix product reaches on this machine now (``--gemm``). Achieved FLOP/s: the FLOPs of the network per
phase, counted by torch's FlopCounterMode on the run's own network, over the seconds the run spent in that phase
(metrics.jsonl's ``time/act_s`` and ``time/learn_s``, rank means).

    python benchmarks/roofline.py [--keys "task=Breakout-v5 steps=20480"] [--world-size 1] [--gemm]
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import harness as h

PHASES = ("act", "learn", "env")
# Dense FLOP/s of GPUs whose datasheets give them (fp32 without tensor cores; bf16 on tensor cores, no sparsity)
GPUS = {
    "H200": (67e12, 989e12),
    "H100 PCIe": (51e12, 756e12),
    "H100": (67e12, 989e12),  # SXM
    "A100": (19.5e12, 312e12),
    "L40S": (91.6e12, 362e12),
    "A10G": (31.2e12, 70e12),
    "RTX 4090": (82.6e12, 165e12),
}


@dataclasses.dataclass(frozen=True)
class Peak:
    what: str  # the device in words, with the numbers the peak is made of
    fp32: float  # FLOP/s
    bf16: float | None  # None: no bf16 arithmetic faster than fp32


def cpu_peak(cpuinfo: str, cores: int = 1) -> Peak:
    """The peak of ``cores`` cores of the CPU that ``cpuinfo`` (the text of /proc/cpuinfo) describes.

    FLOP per cycle and core, fp32: 2 fused multiply-adds a cycle on vectors of 16 floats with AVX-512 (Intel's two
    512-bit units), of 8 with AVX2 or on AMD's Zen 4 (AVX-512 on 256-bit units; Zen 5, family 26, has 512-bit ones).
    bf16: AMX tiles 1,024 (Intel Sapphire Rapids on); AVX512_BF16's dot products twice fp32's rate.
    """
    first = cpuinfo.split("\n\n")[0]
    field = {m.group(1).strip(): m.group(2).strip() for m in re.finditer(r"^([^:\n]+):(.*)$", first, re.M)}
    flags, vendor = set(field.get("flags", "").split()), field.get("vendor_id", "")
    ghz = float(field.get("cpu MHz", "0")) / 1000
    wide = "avx512f" in flags and (vendor != "AuthenticAMD" or int(field.get("cpu family", "0")) >= 26)
    lanes = 16 if wide else 8 if {"avx2", "fma"} <= flags or "avx512f" in flags else 4
    fp32 = 2 * 2 * lanes  # two FMA pipes, two FLOPs an FMA
    bf16 = 1024 if "amx_bf16" in flags else 2 * fp32 if "avx512_bf16" in flags else None
    name = field.get("model name", "CPU")
    unit = "AMX" if bf16 == 1024 else "AVX512_BF16" if bf16 else "none"
    what = f"{name}, {cores} core(s) at {ghz:.2f} GHz: fp32 {fp32} FLOP/cycle, bf16 {bf16 or '-'} ({unit})"
    return Peak(what, cores * ghz * 1e9 * fp32, cores * ghz * 1e9 * bf16 if bf16 else None)


def gpu_peak(name: str) -> Peak | None:
    """The datasheet peak of a GPU by its name (``torch.cuda.get_device_name``); None when it is not listed."""
    for model, (fp32, bf16) in GPUS.items():
        if model in name:
            return Peak(f"{name} (datasheet, dense)", fp32, bf16)
    return None


def network_flops(keys: list[str]) -> dict[str, float]:
    """FLOPs of the PPO network of ``keys`` per global agent step: ``act`` (one forward) and ``learn`` (``epochs``
    forward and backward passes through the loss, per sample), counted on a batch of 64 samples."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ddprl.algos.ppo.loop import build_agent
    from ddprl.config import load_config
    from ddprl.envs import make_env

    cfg = load_config(["world_size=1", *keys])
    env = make_env(cfg.task, 1, seed=0, training=True, backend=cfg.env_backend, **cfg.env_kwargs)
    agent = build_agent(cfg, env)
    first = torch.as_tensor(env.reset()).float()
    env.close()
    obs = first.expand(64, *first.shape[1:]).contiguous()
    with FlopCounterMode(display=False) as act, torch.inference_mode():
        agent.act(obs)
    out = agent(obs)
    with FlopCounterMode(display=False) as learn:
        out = agent(obs, out.action)
        (out.log_prob.sum() + out.entropy.sum() + out.value.sum()).backward()
    return {"act": act.get_total_flops() / 64, "learn": cfg.epochs * learn.get_total_flops() / 64}


def gemm_ceiling(dtype: str, n: int = 2048, threads: int = 1) -> float:
    """FLOP/s of an n x n matrix product on this machine now (best of 5)."""
    import time

    import torch

    torch.set_num_threads(threads)
    a = torch.rand(n, n, dtype=getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype]))
    a @ a
    best = min(_timed(lambda: a @ a, time.perf_counter) for _ in range(5))
    return 2 * n**3 / best


def _timed(fn, clock) -> float:
    start = clock()
    fn()
    return clock() - start


def achieved(rows: list[dict], flops: dict[str, float], world_size: int) -> dict[str, dict[str, float | None]]:
    """Per phase: seconds per rank and FLOP/s per rank, from a run's metrics rows and ``flops`` per global step. The
    first row (start-up, the first iteration's warm-up) is left out: each row's times cover the steps since the row
    before it."""
    kept, steps = rows[1:], rows[-1]["step"] - rows[0]["step"]
    out = {}
    for phase in PHASES:
        seconds = sum(r.get(f"time/{phase}_s", 0.0) for r in kept)
        rate = flops[phase] * steps / world_size / seconds if seconds and phase in flops else None
        out[phase] = {"s": seconds, "flops": rate}
    return out


def main() -> None:
    parser = h.parser(__doc__)
    parser.add_argument("--keys", default="task=Breakout-v5 steps=20480", help="ddprl train keys of the PPO run")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--gemm", action="store_true", help="also measure a large matrix product's FLOP/s")
    args = parser.parse_args()
    keys = [*args.keys.split(), f"world_size={args.world_size}", *h.QUIET]
    import torch

    peak = cpu_peak(Path("/proc/cpuinfo").read_text(), cores=1)
    if torch.cuda.is_available():
        peak = gpu_peak(torch.cuda.get_device_name()) or peak
    print(f"machine: {h.machine()}\npeak per rank: {peak.what}")
    flops = network_flops(keys)
    rows = {}
    for precision in ("fp32", "bf16"):
        result = h.train([*keys, f"precision={precision}"], env=h.ONE_THREAD)
        rows[precision] = achieved(result["rows"], flops, args.world_size)
    h.table(["phase", "precision", "s per rank", "GFLOP/s per rank", "% of fp32 peak", "% of bf16 peak"])
    for precision, phases in rows.items():
        for phase, value in phases.items():
            rate = value["flops"]
            cells = [phase, precision, f"{value['s']:.1f}"]
            if rate is None:
                cells += ["-", "-", "-"]
            else:
                cells += [f"{rate / 1e9:.1f}", f"{100 * rate / peak.fp32:.0f} %"]
                cells += [f"{100 * rate / peak.bf16:.0f} %" if peak.bf16 else "-"]
            h.row(cells)
    if args.gemm:
        for dtype in ("fp32", "bf16"):
            print(f"2048 x 2048 matrix product, {dtype}, one thread: {gemm_ceiling(dtype) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    sys.exit(main())
