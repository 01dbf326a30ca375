"""The runnable example of docs/supervised.md runs as written and says what the page shows."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO, cli_env


@pytest.mark.slow
def test_the_trainer_example_in_the_docs_runs(tmp_path):
    pytest.importorskip("sklearn")
    page = (REPO / "docs" / "supervised.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    example = next(b for b in blocks if 'if __name__ == "__main__"' in b)
    script = tmp_path / "wine.py"
    script.write_text(example)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+) on 36 samples", proc.stdout).group(1))
    assert accuracy >= 0.9, proc.stdout
    assert "'val/num_samples': 35.0" in proc.stdout
