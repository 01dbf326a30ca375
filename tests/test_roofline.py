"""benchmarks/roofline.py: the peaks computed from CPU flags and GPU names, the FLOPs counted on ddprl's own
network, and the achieved rate per phase from a run's time split."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import roofline  # noqa: E402 (the path above first)

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
cpu MHz\t\t: 2596.148
flags\t\t: fpu avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
"""
SAPPHIRE_RAPIDS = """vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Platinum 8488C
cpu MHz\t\t: 2400.000
flags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile
"""
HASWELL = """vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU E5-2680 v3
cpu MHz\t\t: 2500.000
flags\t\t: fpu avx avx2 fma
"""


def test_cpu_peaks_from_the_flags_and_the_clock():
    zen4 = roofline.cpu_peak(ZEN4, cores=2)
    assert zen4.fp32 == pytest.approx(2 * 2.596148e9 * 32) and zen4.bf16 == pytest.approx(2 * 2.596148e9 * 64)
    assert "AMD EPYC 9R14, 2 core(s) at 2.60 GHz" in zen4.what
    spr = roofline.cpu_peak(SAPPHIRE_RAPIDS)
    assert spr.fp32 == pytest.approx(2.4e9 * 64) and spr.bf16 == pytest.approx(2.4e9 * 1024) and "AMX" in spr.what
    old = roofline.cpu_peak(HASWELL)
    assert old.fp32 == pytest.approx(2.5e9 * 32) and old.bf16 is None


def test_gpu_peaks_by_name():
    assert roofline.gpu_peak("NVIDIA H100 80GB HBM3").bf16 == 989e12
    assert roofline.gpu_peak("NVIDIA H100 PCIe").fp32 == 51e12
    assert roofline.gpu_peak("NVIDIA H200").fp32 == 67e12
    assert roofline.gpu_peak("Tesla K80") is None


def test_the_flops_of_the_cartpole_network_by_hand():
    """Actor 4-64-64-2 and critic 4-64-64-1: 8,896 multiply-adds a forward; learning takes epochs x (forward and
    backward, twice the forward's again)."""
    flops = roofline.network_flops(["task=CartPole-v1", "epochs=10"])
    assert flops["act"] == 2 * (4 * 64 + 64 * 64 + 64 * 2 + 4 * 64 + 64 * 64 + 64 * 1)
    assert flops["learn"] == pytest.approx(10 * 3 * flops["act"], rel=0.02)


def test_achieved_rates_leave_out_the_first_row():
    rows = [
        {"step": 1000, "time/act_s": 50.0, "time/learn_s": 50.0, "time/env_s": 9.0},
        {"step": 3000, "time/act_s": 1.0, "time/learn_s": 4.0, "time/env_s": 2.0},
        {"step": 5000, "time/act_s": 1.0, "time/learn_s": 4.0, "time/env_s": 2.0},
    ]
    out = roofline.achieved(rows, {"act": 10.0, "learn": 100.0}, world_size=2)
    assert out["act"] == {"s": 2.0, "flops": 10.0 * 4000 / 2 / 2.0}
    assert out["learn"]["flops"] == 100.0 * 4000 / 2 / 8.0
    assert out["env"] == {"s": 4.0, "flops": None}


@pytest.mark.parametrize("text, units", [(ZEN4, "AVX512_BF16"), (SAPPHIRE_RAPIDS, "AMX"), (HASWELL, None)])
def test_bf16_units_of_a_cpu_from_its_flags(tmp_path, text, units):
    import torch

    from ddprl.system import bf16_units

    (tmp_path / "cpuinfo").write_text(text)
    assert bf16_units(torch.device("cpu"), str(tmp_path / "cpuinfo")) == units
    assert bf16_units(torch.device("cpu"), str(tmp_path / "missing")) is None
