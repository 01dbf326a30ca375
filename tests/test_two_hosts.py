"""A checkpoint of a job over two machines, evaluated on one."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from conftest import REPO, run_cli


def test_a_two_machine_checkpoint_evaluates_in_one_process(tmp_path):
    """A spawn-mode job over two machines saves nnodes=2 in its config; ``ddprl eval`` (and the
    supervised evaluation) of its checkpoint is one process on one machine all the same."""
    def as_if_from_two_machines(path: Path) -> Path:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt["config"].update(world_size=4, nnodes=2, node_rank=1, master_addr="gpu01", master_port="29500")
        torch.save(ckpt, path)
        return path

    tiny = ["world_size=1", "progress=false", "device=cpu", "checkpoint_freq=0"]
    res = run_cli(["train", *tiny, f"run_dir={tmp_path / 'ppo'}", "steps=128", "num_envs=2", "n_steps=64",
                   "batch_size=64", "epochs=1", "eval_episodes=0"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = as_if_from_two_machines(tmp_path / "ppo" / "checkpoints" / "latest.pt")
    res = run_cli(["eval", f"checkpoint={ckpt}", "episodes=2"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"^return_mean=-?[0-9.]+ .* episodes=2$", res.stdout, re.MULTILINE), res.stdout

    task = "task=supervised_fns:tiny_task"  # importable from tests/
    res = run_cli(["train", "algo=supervised", task, *tiny, "epochs=1", f"run_dir={tmp_path / 'sup'}"],
                  cwd=REPO / "tests")
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = as_if_from_two_machines(tmp_path / "sup" / "checkpoints" / "latest.pt")
    res = run_cli(["eval", f"checkpoint={ckpt}", task, "split=val"], cwd=REPO / "tests")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "val/num_samples=37" in res.stdout, res.stdout
