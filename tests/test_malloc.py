"""``malloc=keep`` (ddprl/runtime/malloc.py): a repeated training step stops taking fresh pages."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from ddprl.config import load_config
from ddprl.errors import UsageError

BLOCKS, BLOCK_BYTES = 8, 10 << 20  # a step's churn: eight 10 MB blocks, below the 32 MB mmap ceiling
STEP = f"""
import resource, sys, torch
from ddprl.runtime.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():  # filled and freed together, like a step's activations and their gradients
    blocks = [torch.ones({BLOCK_BYTES} // 4) for _ in range({BLOCKS})]
    del blocks
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

    churn = 10 * BLOCKS * BLOCK_BYTES // 4096  # pages the ten measured steps fill
    # glibc's defaults trim the freed blocks off the heap's top and fault them in again next step. Whether
    # they do depends on where the heap's other allocations fell (about one process in four keeps them,
    # with Python's hash seed and thread timing), so the first of up to six runs that does shows it.
    system = [faults("system")]
    while system[-1] <= churn // 2 and len(system) < 6:
        system.append(faults("system"))
    assert system[-1] > churn // 2, (system, churn)
    # The fewest of three runs: a kernel that reclaims idle memory on its own (DAMON's kdamond on some
    # VMs) takes back now and then what malloc kept, and those faults are the kernel's, not malloc's.
    keep = min(faults("keep") for _ in range(3))
    assert keep < churn // 100, (keep, churn)


def test_malloc_key_is_checked():
    assert load_config(["malloc=system"]).malloc == "system"
    with pytest.raises(UsageError, match="malloc='fast' is not keep or system"):
        load_config(["malloc=fast"])
