"""Functions the Atari tests run on every rank (importable by spawned processes)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ACTIONS = 6  # Pong's minimal action set


def nature_cnn_agent(actions: int = ACTIONS):
    """The Atari actor-critic every test starts from (seeded: the same weights in every process)."""
    from ddprl.algos.ppo.networks import ActorCritic

    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    return ActorCritic(space, gym.spaces.Discrete(actions), policy="nature_cnn")


def ppo_learn_cnn(rt, cfg, out: str, batch_path: str) -> None:
    """PPO's update on this rank's share of a batch of Atari frames; saves the parameters."""
    from ddprl.algos.ppo.update import UpdateStep, learn

    data = torch.load(batch_path)
    n = data["obs"].shape[0] // rt.world_size
    local = {k: v[rt.rank * n : (rt.rank + 1) * n] for k, v in data.items()}
    agent = nature_cnn_agent()
    rt.broadcast_module(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=1e-5)
    update = UpdateStep(rt, agent, optimizer, local, cfg, lambda x: x, nullcontext())
    torch.manual_seed(100 + rt.rank)
    metrics = learn(rt, update, cfg)
    params = {k: v.clone() for k, v in agent.state_dict().items()}
    torch.save({"params": params, "metrics": metrics}, Path(out) / f"rank{rt.rank}.pt")
