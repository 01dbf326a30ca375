"""Functions run on every rank by tests through ``ddprl.runtime.launch`` (importable by spawn)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ddprl.errors import UsageError


def collectives(rt, cfg, out: str) -> None:
    result = {
        "rank": rt.rank,
        "sum": rt.all_reduce_sum(rt.rank + 1),
        "mean_dict": rt.all_reduce_mean({"b": float(rt.rank), "a": 10.0 * (rt.rank + 1)}),
        "tensor_sum": rt.all_reduce_sum(torch.tensor([1.0, float(rt.rank)])),
        "broadcast": rt.broadcast_object({"from": rt.rank}),
        "gathered": rt.all_gather_object(rt.rank * 2),
        "gathered_tensor": rt.all_gather(torch.tensor([[rt.rank, 10.0 * rt.rank]])),
    }
    torch.save(result, Path(out) / f"rank{rt.rank}.pt")


def drifted_params(rt, cfg, out: str) -> None:
    """Ranks whose parameters differ must be caught by check_in_sync."""
    net = torch.nn.Linear(3, 2)
    with torch.no_grad():
        net.weight.fill_(float(rt.rank))  # no DDP broadcast: deliberately different
    try:
        rt.check_in_sync(net)
        caught = False
    except RuntimeError:
        caught = True
    wrapped = rt.wrap(torch.nn.Linear(3, 2))  # DDP broadcasts rank 0's weights
    rt.check_in_sync(wrapped)
    torch.save({"caught": caught}, Path(out) / f"rank{rt.rank}.pt")


def rank_one_raises(rt, cfg, out: str) -> None:
    if rt.rank == 1:
        raise ValueError("deliberate failure on rank 1")
    rt.barrier()  # rank 0 waits here for a rank that never comes
    time.sleep(600)


def rank_one_usage_error(rt, cfg, out: str) -> None:
    if rt.rank == 1:
        raise UsageError("bad input found inside a rank")
    rt.barrier()


def env_seeds(rt, cfg, out: str) -> None:
    from ddprl.envs import env_seed, make_env

    env = make_env("CartPole-v1", 2, seed=env_seed(cfg.seed, rt.rank))
    obs = env.reset()
    torch.save({"seed": env_seed(cfg.seed, rt.rank), "obs": obs}, Path(out) / f"rank{rt.rank}.pt")


def rms_update(rt, cfg, out: str) -> None:
    from ddprl.normalize import RunningMeanStd

    g = torch.Generator().manual_seed(0)
    data = torch.randn(2, 50, 3, generator=g) * torch.tensor([1.0, 5.0, 0.1]) + 2.0
    rms = RunningMeanStd((3,))
    rms.update(data[rt.rank], reduce_sum=rt.all_reduce_sum)
    rms.update(data[rt.rank] * 2, reduce_sum=rt.all_reduce_sum)
    torch.save(rms.state_dict(), Path(out) / f"rank{rt.rank}.pt")


def ppo_learn(rt, cfg, out: str, batch_path: str, steps: int = 1) -> None:
    """Run PPO's update phase on this rank's share of a fixed batch; save the parameters."""
    from ddprl.algos.ppo.loop import learn
    from ddprl.algos.ppo.networks import ActorCritic
    import gymnasium as gym

    data = torch.load(batch_path)
    n = data["obs"].shape[0] // rt.world_size
    local = {k: v[rt.rank * n:(rt.rank + 1) * n] for k, v in data.items()}
    torch.manual_seed(0)
    agent = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), hidden_sizes=[16, 16])
    model = rt.wrap(agent)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-5, fused=True)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    torch.manual_seed(100 + rt.rank)
    for _ in range(steps):
        learn(rt, model, opt, scaler, local, cfg)
    checksums = rt.all_gather_object(float(sum(p.detach().double().sum() for p in model.parameters())))
    torch.save({"params": {k: v.clone() for k, v in rt.unwrap(model).state_dict().items()},
                "checksums": checksums}, Path(out) / f"rank{rt.rank}.pt")
