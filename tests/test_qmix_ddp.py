"""QMIX's update under DDP (2 gloo ranks) equals one process on the whole batch."""

from __future__ import annotations

import functools

import dist_fns
import pytest
import torch

from ddprl.config import load_config
from ddprl.runtime import launch

A, U, OBS, S, T = 3, 4, 6, 7, 5  # agents, actions, obs, state features, episode limit


def episodes(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` random padded episodes of 2..T steps, some terminated, the rest truncated."""
    lengths = torch.randint(2, T + 1, (n,), generator=g)
    filled = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    avail = torch.rand(n, T + 1, A, U, generator=g) < 0.6
    avail[..., 0] = True
    actions = torch.multinomial(avail[:, :T].reshape(-1, U).float(), 1, generator=g).view(n, T, A) * filled[..., None]
    observed = torch.arange(T + 1).unsqueeze(0) <= lengths.unsqueeze(1)  # the steps and the bootstrap step
    avail &= observed[..., None, None]  # padding: nothing available
    terminated = torch.zeros(n, T, dtype=torch.bool)
    ends = torch.rand(n, generator=g) < 0.5
    terminated[torch.arange(n)[ends], lengths[ends] - 1] = True
    return {
        "obs": torch.randn(n, T + 1, A, OBS, generator=g),
        "state": torch.randn(n, T + 1, S, generator=g),
        "avail": avail,
        "actions": actions,
        "reward": torch.randn(n, T, generator=g) * filled,
        "terminated": terminated,
        "filled": filled,
    }


@pytest.fixture(scope="module")
def batches_path(tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    data = {"dims": (A, U, OBS, S), "steps": [[episodes(8, g), episodes(8, g)] for _ in range(5)]}
    path = tmp_path_factory.mktemp("qmix") / "batches.pt"
    torch.save(data, path)
    return str(path)


def run(tmp_path, batches_path, world_size, steps, sync_freq=1, use_rnn=False, name=""):
    cfg = load_config(
        [
            "algo=qmix",
            f"world_size={world_size}",
            f"num_envs={world_size}",
            "batch_size=4",
            f"sync_freq={sync_freq}",
            "dist_timeout=60",
            "td_lambda=0.6",
            "double_q=true",
            "standardise_rewards=true",
            "target_update_interval=2",
            "lr=0.01",
            f"use_rnn={str(use_rnn).lower()}",
        ]
    )
    out = tmp_path / f"w{world_size}-s{sync_freq}-r{int(use_rnn)}{name}"
    out.mkdir()
    launch(functools.partial(dist_fns.qmix_learn, out=str(out), batch_path=batches_path, steps=steps), cfg)
    return [torch.load(out / f"rank{r}.pt") for r in range(world_size)]


def assert_same(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), (k, (a[k] - b[k]).abs().max())


@pytest.mark.parametrize("use_rnn", [False, True])
def test_two_half_batches_equal_one_process_on_the_whole_batch(tmp_path, batches_path, use_rnn):
    # 5 updates with a hard target copy every 2: live and target networks (agent, mixer and
    # hypernetworks) match one process, and the ranks match each other exactly.
    single = run(tmp_path, batches_path, 1, steps=5, use_rnn=use_rnn)[0]
    ddp = run(tmp_path, batches_path, 2, steps=5, use_rnn=use_rnn)
    assert any(k.startswith("mixer.hyper_w1") for k in single["params"])
    assert_same(single["params"], ddp[0]["params"])
    assert_same(single["target"], ddp[0]["target"])
    for k in ddp[0]["params"]:
        assert torch.equal(ddp[0]["params"][k], ddp[1]["params"][k])
        assert torch.equal(ddp[0]["target"][k], ddp[1]["target"][k])
    assert ddp[0]["reward_mean"] == pytest.approx(single["reward_mean"], abs=1e-9)
    assert ddp[0]["updates"] == ddp[1]["updates"] == 5
    # the gradient itself (its norm before the clip, each update), where Adam would hide a constant
    # factor in the parameters: the ranks' average is the whole batch's gradient, not half or twice it
    norms = [m["grad_norm"] for m in single["metrics"]]
    assert min(norms) > 1e-3
    for r in ddp:
        assert [m["grad_norm"] for m in r["metrics"]] == pytest.approx(norms, rel=1e-5)
    # the target is a copy of the live weights at update 4, not the current ones
    assert not torch.equal(single["target"]["agent.fc2.weight"], single["params"]["agent.fc2.weight"])


def test_sync_freq_batches_equal_one_batch_of_all_of_them(tmp_path, batches_path):
    # 2 ranks x 2 accumulated batches of 4 episodes == 1 process on the 16 episodes at once.
    data = torch.load(batches_path)
    merged = {
        "dims": data["dims"],
        "steps": [
            [{k: torch.cat([b0[k][:4], b1[k][:4], b0[k][4:], b1[k][4:]]) for k in b0}] for b0, b1 in data["steps"]
        ],
    }
    merged_path = tmp_path / "merged.pt"
    torch.save(merged, merged_path)
    single = run(tmp_path, str(merged_path), 1, steps=3, name="-merged")[0]
    ddp = run(tmp_path, batches_path, 2, steps=3, sync_freq=2)
    assert_same(single["params"], ddp[0]["params"])
