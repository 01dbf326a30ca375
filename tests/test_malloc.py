"""``malloc=keep`` (ddprl/runtime/malloc.py): a repeated training step stops taking fresh pages."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from ddprl.config import load_config
from ddprl.errors import UsageError

STEP = """
import resource, sys, torch
from ddprl.runtime.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
x, conv = torch.randn(64, 3, 64, 64), torch.nn.Conv2d(3, 32, 5)
def step():  # activations of ~30 MB and their gradients, allocated and freed every time
    conv(x).relu().sum().backward()
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")
def test_keep_freed_memory_spares_the_page_faults_of_a_repeated_step():
    def faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", STEP, mode], capture_output=True, text=True, timeout=120, check=True
        )
        return int(out.stdout.split()[-1])

    # The fewest of three runs: a kernel that reclaims idle memory on its own (DAMON's kdamond on some
    # VMs) takes back now and then what malloc kept, and those faults are the kernel's, not malloc's.
    system, keep = (min(faults(mode) for _ in range(3)) for mode in ("system", "keep"))
    # glibc's defaults hand the step's large blocks back to the kernel and fault them in again
    assert keep * 3 < system, (keep, system)


def test_malloc_key_is_checked():
    assert load_config(["malloc=system"]).malloc == "system"
    with pytest.raises(UsageError, match="malloc='fast' is not keep or system"):
        load_config(["malloc=fast"])
