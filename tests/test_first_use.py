"""A new user's first job on the base install (``pip install -e .`` on top of torch): every command the
end-of-job summary suggests runs with exit 0 and writes what it says.

The test machine has every extra installed, so the base install is a virtual environment of its own
whose site-packages holds links to the installed files of torch, ddprl's base requirements and what
they require in turn, nothing else: modules and package metadata as a fresh install would have them.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sysconfig
import venv
from importlib import metadata
from pathlib import Path

import pytest
from conftest import cli_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SUMMARY_COMMAND = re.compile(r"^  (?:evaluate|watch|plot|next) +(ddprl .*)$", re.M)


def _base_distributions() -> set[str]:
    """ddprl's requirements without extras, and torch's, followed to the end (canonical names)."""
    seen: set[str] = set()
    wanted = ["ddprl", "torch", "pip", "setuptools"]
    while wanted:
        name = canonicalize_name(wanted.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
    return seen


@pytest.fixture(scope="module")
def base_python(tmp_path_factory) -> Path:
    """The Python of a virtual environment that holds the base install only."""
    base = _base_distributions()
    root = tmp_path_factory.mktemp("base-install")
    venv.create(root, with_pip=False, symlinks=True)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in base:
            continue
        for entry in {file.parts[0] for file in dist.files or []} - {"..", "__pycache__"}:
            source = Path(dist.locate_file(entry))
            if source.exists() and source.parent == here and not (site / entry).exists():
                (site / entry).symlink_to(source)
    probe = subprocess.run([python, "-c", "import torch, ddprl; import pygame"], capture_output=True, text=True)
    assert "No module named 'pygame'" in probe.stderr, probe.stderr
    return python


def _ddprl(command: str, cwd: Path, python: Path) -> subprocess.CompletedProcess:
    args = shlex.split(command)
    assert args[0] == "ddprl", command
    return subprocess.run(
        [python, "-m", "ddprl", *args[1:]], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=300
    )


def test_every_command_of_the_default_jobs_summary_runs_on_the_base_python(tmp_path, base_python):
    """``ddprl train`` (the default job, world_size=auto), then each line of its summary: eval, play with
    a video (CartPole drawn without pygame), plot (beside the run)."""
    job = _ddprl("ddprl train steps=2048 run_dir=runs/demo progress=false", tmp_path, base_python)
    assert job.returncode == 0, job.stderr[-3000:]
    commands = SUMMARY_COMMAND.findall(job.stdout)
    assert [c.split()[1] for c in commands] == ["eval", "play", "plot"], job.stdout
    for command in commands:
        res = _ddprl(command, tmp_path, base_python)
        assert res.returncode == 0, (command, res.stderr[-3000:])
    assert (tmp_path / "ppo.gif").stat().st_size > 10_000
    assert (tmp_path / "runs" / "demo" / "curves.png").stat().st_size > 10_000
    assert not (tmp_path / "curves.png").exists()
