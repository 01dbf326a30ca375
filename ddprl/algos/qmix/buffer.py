"""One rank's episodes: those in progress in its envs, and the replay of finished ones.

An episode of at most T steps is stored padded to T (T+1 for what is observed: the step after
the last is the observation the last transition leads to, bootstrapped when truncated):

    obs (T+1, A, O)  state (T+1, S)  avail (T+1, A, U)  actions (T, A)  reward (T,)
    terminated (T,)  filled (T,)   -- filled[t]: step t happened (the loss mask)

Everything past an episode's end is zero (avail False, filled False).
"""

from __future__ import annotations

from typing import Any

import torch

from ddprl.envs.marl.base import MAObs


def episode_fields(
    episode_limit: int, n_agents: int, obs_dim: int, state_dim: int, n_actions: int
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape (without the leading episode dim) and dtype of each stored field."""
    t, a = episode_limit, n_agents
    return {
        "obs": ((t + 1, a, obs_dim), torch.float32),
        "state": ((t + 1, state_dim), torch.float32),
        "avail": ((t + 1, a, n_actions), torch.bool),
        "actions": ((t, a), torch.long),
        "reward": ((t,), torch.float32),
        "terminated": ((t,), torch.bool),
        "filled": ((t,), torch.bool),
    }


def _zeros(n: int, fields: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: torch.zeros((n, *shape), dtype=dtype, device=device) for name, (shape, dtype) in fields.items()}


class EpisodeStaging:
    """The episode each env is playing, written step by step; finished ones are handed out whole.

    >>> staging = EpisodeStaging(num_envs=4, fields=fields, device="cpu")            # doctest: +SKIP
    >>> done_episodes = staging.record(obs, actions, reward, terminated, truncated, final_obs)
    """

    def __init__(self, num_envs: int, fields: dict[str, Any], device: torch.device | str):
        self.data = _zeros(num_envs, fields, torch.device(device))
        self.t = torch.zeros(num_envs, dtype=torch.long, device=device)  # next step to write
        self.rows = torch.arange(num_envs, device=device)

    def record(
        self,
        obs: MAObs,
        actions: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        final_obs: MAObs,
    ) -> dict[str, torch.Tensor] | None:
        """Write one step of every env; return the episodes that ended with it (or None).

        ``obs`` is what the agents saw before acting; ``final_obs`` the step after the last for
        envs that ended (``terminated | truncated``).
        """
        d, rows, t = self.data, self.rows, self.t
        d["obs"][rows, t], d["state"][rows, t], d["avail"][rows, t] = obs.obs, obs.state, obs.avail
        d["actions"][rows, t], d["reward"][rows, t] = actions, reward
        d["terminated"][rows, t], d["filled"][rows, t] = terminated, True
        self.t += 1
        ended = torch.nonzero(terminated | truncated).flatten()
        if ended.numel() == 0:
            return None
        last = self.t[ended]  # the observation after the last step
        d["obs"][ended, last], d["state"][ended, last] = final_obs.obs[ended], final_obs.state[ended]
        d["avail"][ended, last] = final_obs.avail[ended]
        episodes = {name: value[ended].clone() for name, value in d.items()}
        for value in d.values():
            value[ended] = 0
        self.t[ended] = 0
        return episodes

    def clear(self) -> None:
        """Forget the episodes in progress (the envs were reset)."""
        for value in self.data.values():
            value.zero_()
        self.t.zero_()


class EpisodeBuffer:
    """A ring of ``capacity`` padded episodes; uniform sampling of distinct episodes, as EPyMARL."""

    def __init__(self, capacity: int, fields: dict[str, Any], device: torch.device | str):
        self.capacity = capacity
        self.device = torch.device(device)
        self.data = _zeros(capacity, fields, self.device)
        self.size = 0  # episodes stored
        self.pos = 0  # next slot to overwrite
        self.episodes_in = 0  # episodes ever added

    def add(self, episodes: dict[str, torch.Tensor]) -> None:
        n = episodes["filled"].shape[0]
        if n > self.capacity:  # more at once than fit: the newest win
            episodes = {k: v[-self.capacity :] for k, v in episodes.items()}
            n = self.capacity
        slots = (self.pos + torch.arange(n, device=self.device)) % self.capacity
        for name, value in episodes.items():
            self.data[name][slots] = value.to(self.device)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.episodes_in += n

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """``batch_size`` distinct stored episodes, cut to the longest of them (fewer padded steps)."""
        if self.size < batch_size:
            raise ValueError(f"{self.size} episodes stored, {batch_size} asked")
        idx = torch.randperm(self.size, generator=generator, device="cpu")[:batch_size].to(self.device)
        return truncate(take(self.data, idx))

    def state_dict(self) -> dict[str, Any]:
        return {
            "data": {k: v[: self.size].cpu() for k, v in self.data.items()},
            "pos": self.pos,
            "episodes_in": self.episodes_in,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        n = state["data"]["filled"].shape[0]
        for name, value in state["data"].items():
            self.data[name][:n] = value.to(self.device)
        self.size, self.pos, self.episodes_in = n, state["pos"], state["episodes_in"]

    @staticmethod
    def episodes_of(state: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
        """The episodes of a saved replay, oldest first: from the next slot to overwrite round the ring (until it
        first fills, that slot is the end of what is stored)."""
        data, pos = state["data"], state["pos"]
        n = data["filled"].shape[0]
        return [{name: value[i] for name, value in data.items()} for i in [*range(pos, n), *range(pos)]]

    def extend(self, episodes: list[dict[str, torch.Tensor]]) -> None:
        """Add ``episodes`` oldest first (beyond the capacity the newest stay)."""
        if episodes:
            self.add({name: torch.stack([e[name] for e in episodes]) for name in episodes[0]})


def take(data: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: value[idx] for name, value in data.items()}


def truncate(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch cut to its longest episode: T steps (T+1 observations)."""
    t = int(batch["filled"].any(0).nonzero().max()) + 1 if bool(batch["filled"].any()) else 1
    return {
        name: value[:, : t + 1] if value.shape[1] == batch["filled"].shape[1] + 1 else value[:, :t]
        for name, value in batch.items()
    }
