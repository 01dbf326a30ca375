"""DDP equivalences (DESIGN.md invariants 1, 2, 5) on real gloo process groups, 2 ranks."""

from __future__ import annotations

import functools

import pytest
import torch

import dist_fns
from ddprl.config import load_config
from ddprl.runtime import launch

N = 64  # samples in the whole batch


@pytest.fixture(scope="module")
def batch_path(tmp_path_factory):
    g = torch.Generator().manual_seed(7)
    batch = {
        "obs": torch.randn(N, 4, generator=g),
        "actions": torch.randint(0, 2, (N,), generator=g),
        "log_probs": torch.full((N,), -0.69) + 0.05 * torch.randn(N, generator=g),
        "values": torch.randn(N, generator=g),
        "advantages": torch.randn(N, generator=g),
        "returns": torch.randn(N, generator=g),
    }
    path = tmp_path_factory.mktemp("batch") / "batch.pt"
    torch.save(batch, path)
    return str(path)


def run_learn(tmp_path, batch_path, world_size, batch_size, sync_freq=1, epochs=1, steps=1):
    cfg = load_config([f"world_size={world_size}", f"num_envs={world_size * 2}", f"batch_size={batch_size}",
                       f"sync_freq={sync_freq}", f"epochs={epochs}", "n_steps=64", "dist_timeout=60",
                       "max_grad_norm=0", "target_kl=null"])
    out = tmp_path / f"w{world_size}-b{batch_size}-s{sync_freq}-e{epochs}-n{steps}"
    out.mkdir()
    launch(functools.partial(dist_fns.ppo_learn, out=str(out), batch_path=batch_path, steps=steps), cfg)
    return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]


def assert_same_params(a, b, atol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), (k, (a[k] - b[k]).abs().max())


def test_two_half_batches_equal_one_full_batch(tmp_path, batch_path):
    single = run_learn(tmp_path, batch_path, world_size=1, batch_size=N)
    ddp = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 2)
    assert_same_params(single[0]["params"], ddp[0]["params"], atol=1e-6)
    assert_same_params(ddp[0]["params"], ddp[1]["params"], atol=0)
    # and the update really moved the weights (an equivalence of two no-ops proves nothing)
    untouched = run_learn(tmp_path, batch_path, world_size=1, batch_size=N, epochs=1, steps=0)
    diff = max((single[0]["params"][k] - untouched[0]["params"][k]).abs().max() for k in untouched[0]["params"])
    assert diff > 1e-3


def test_sync_freq_accumulates_like_one_big_batch(tmp_path, batch_path):
    single = run_learn(tmp_path, batch_path, world_size=1, batch_size=N)
    accumulated = run_learn(tmp_path, batch_path, world_size=1, batch_size=N // 2, sync_freq=2)
    assert_same_params(single[0]["params"], accumulated[0]["params"], atol=1e-6)
    ddp_accumulated = run_learn(tmp_path, batch_path, world_size=2, batch_size=N // 4, sync_freq=2)
    assert_same_params(single[0]["params"], ddp_accumulated[0]["params"], atol=1e-6)


def test_ranks_identical_after_many_updates(tmp_path, batch_path):
    ranks = run_learn(tmp_path, batch_path, world_size=2, batch_size=8, epochs=3, steps=3)
    assert ranks[0]["checksums"][0] == ranks[0]["checksums"][1]
    assert_same_params(ranks[0]["params"], ranks[1]["params"], atol=0)
