"""The suite's own rules: a test not marked ``gpu`` runs on the CPU whatever the machine has
(``tests/conftest.py``), and no test waits longer inside than pytest-timeout lets it run."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import REPO, cli_env

# A machine with one visible GPU, as torch and the environment present it: the only mock.
FAKE_GPU_MACHINE = """
import os
import torch

os.environ["CUDA_VISIBLE_DEVICES"] = "0"
torch.cuda.device_count = lambda: 1
torch.cuda.is_available = lambda: True


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device")

"""

TESTS_ON_THE_FAKE_MACHINE = """
import os

import pytest
import torch

from conftest import cli_env
from ddprl.prepare import prepare_train
from ddprl.config import load_config
from ddprl.runtime import placement_from_env, resolve_world_size


@pytest.fixture(scope="module")
def world_size_in_a_module_fixture():
    return resolve_world_size("auto", "auto")


def test_cpu(world_size_in_a_module_fixture):
    assert world_size_in_a_module_fixture == 2
    assert resolve_world_size("auto", "auto") == 2 and prepare_train([], None).world_size == 2
    placement = placement_from_env(load_config(["world_size=2", "master_port=29500"]), {}, local_rank=1)
    assert (placement.device.type, placement.backend) == ("cpu", "gloo")
    assert cli_env()["CUDA_VISIBLE_DEVICES"] == "" and os.environ["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.gpu
def test_gpu():
    assert resolve_world_size("auto", "auto") == 1 and torch.cuda.is_available()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_cpu_after_a_gpu_test(world_size_in_a_module_fixture):
    test_cpu(world_size_in_a_module_fixture)
"""


def run_on_this_conftest(
    tmp_path: Path, tests: str, env: dict[str, str], *, timeout: float, plugins: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``tests`` as a test file beside a copy of this suite's conftest (with what it imports), run by
    pytest in its own process, in file order, each ``-p`` plugin in ``plugins`` loaded first."""
    for helper in ("conftest.py", "hosts.py"):
        (tmp_path / helper).write_text((REPO / "tests" / helper).read_text())
    (tmp_path / "test_on_this_conftest.py").write_text(tests)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    cmd += [word for plugin in plugins for word in ("-p", plugin)] + ["test_on_this_conftest.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_tests_not_marked_gpu_run_on_the_cpu_where_a_gpu_is_visible(tmp_path):
    """This suite's conftest on a machine that shows one GPU (CUDA_VISIBLE_DEVICES=0, torch
    counting one device): the tests not marked gpu, a module fixture's included, resolve
    world_size=auto to 2 CPU ranks and hand CUDA_VISIBLE_DEVICES="" to every process they start;
    the gpu test between them sees the GPU (one rank: what every test would get without the rule)."""
    (tmp_path / "fake_gpu_machine.py").write_text(FAKE_GPU_MACHINE)  # a plugin: loaded before the conftest
    res = run_on_this_conftest(
        tmp_path, TESTS_ON_THE_FAKE_MACHINE, cli_env(), timeout=300, plugins=["fake_gpu_machine"]
    )
    assert res.returncode == 0 and "3 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]


TESTS_THAT_SET_VARIABLES = """
import os
import subprocess
import sys

from ddprl.video import headless_rendering


def test_1_writes_a_video_in_process():
    headless_rendering()
    os.environ["DDPRL_SET_BY_A_TEST"] = "1"
    assert os.environ["MUJOCO_GL"] == "egl" and os.environ["SDL_VIDEODRIVER"] == "dummy"


def test_2_a_later_subprocess_inherits_none_of_it():
    names = {"MUJOCO_GL", "SDL_VIDEODRIVER", "DDPRL_SET_BY_A_TEST"}
    code = f"import os; print(sorted({names!r} & set(os.environ)))"
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    assert seen == "[]", seen
"""


def test_a_test_leaves_the_environment_as_it_found_it(tmp_path):
    """Variables a test sets in the pytest process (ddprl/video.py's headless defaults, among
    them MUJOCO_GL=egl) are gone when the next test starts its subprocesses."""
    unset = {"MUJOCO_GL", "SDL_VIDEODRIVER", "DISPLAY", "WAYLAND_DISPLAY", "PYOPENGL_PLATFORM"}  # so the defaults apply
    env = {k: v for k, v in cli_env().items() if k not in unset}
    res = run_on_this_conftest(tmp_path, TESTS_THAT_SET_VARIABLES, env, timeout=120)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]


def test_inner_timeouts_end_before_the_per_test_timeout():
    """Every ``timeout=<seconds>`` a test passes (a subprocess, a wait) is shorter than the
    per-test timeout of pyproject.toml, so a hang is reported by the test's own check."""
    per_test = int(re.search(r"^timeout = (\d+)$", (REPO / "pyproject.toml").read_text(), re.M).group(1))
    inner = {}
    for path in (REPO / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "timeout" and isinstance(node.value, ast.Constant):
                inner[f"{path.name}:{node.value.lineno}"] = node.value.value
    assert len(inner) > 20 and max(inner.values()) >= 300  # the scan sees the suite's waits
    assert {where: t for where, t in inner.items() if t >= per_test} == {}


def test_the_mutation_script_plants_only_code_that_parses_and_its_equivalents_exist():
    """scripts/mutation.py (docs/architecture.md, "Mutation testing"): every mutant changes its file
    and still parses, every target's tests exist, and every mutant listed as equivalent is one the
    script still makes (a stale id would hide a survivor)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation", REPO / "scripts" / "mutation.py")
    mutation = importlib.util.module_from_spec(spec)
    sys.modules["mutation"] = mutation  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mutation)
    mutants = mutation.mutants()
    assert len(mutants) > 500 and len({m.id for m in mutants}) == len(mutants)
    assert set(mutation.EQUIVALENT) <= {m.id for m in mutants}, set(mutation.EQUIVALENT) - {m.id for m in mutants}
    for target in mutation.TARGETS:
        for test in target.tests:
            path, _, name = test.partition("::")
            assert (REPO / path).exists(), test
            assert not name or f"def {name.split('[')[0]}(" in (REPO / path).read_text(), test
    sources = {}
    for m in mutants[::7]:  # a seventh of them: every kind of mutant, in seconds
        original = sources.setdefault(m.path, (REPO / m.path).read_text())
        mutated = mutation.mutated_source(m)
        assert mutated != original, m.id
        ast.parse(mutated)
