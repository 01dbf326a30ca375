"""Per-rank episodic replay buffer for TD-MPC2.

As in TD-MPC2, episodes enter the buffer when they end; updates sample B sub-trajectories of
H+1 observations from single episodes. Each rank owns one buffer filled by its own
environments (docs/architecture.md: every rank owns its environments and its buffer); nothing
here is distributed.

Storage: preallocated tensors of ``capacity`` rows on ``device`` (CPU by default). An
episode of T transitions occupies T+1 consecutive rows: row t holds obs[t] and, for t < T,
action[t], reward[t], terminated[t] (the last row holds the final observation only). Episodes
never wrap around the end of the storage: one that does not fit in the rows left is written
from row 0, and every stored episode it overlaps is evicted (oldest first in ring order), so
the buffer is a ring of whole episodes. Truncation needs no flag: a sub-trajectory never
crosses an episode's end, and ``terminated`` alone decides bootstrapping (docs/architecture.md,
convention 10).

Sampling is uniform over all valid start positions (an episode of T transitions has
T - H + 1 starts for horizon H), i.e. uniform over stored sub-trajectories.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

Device = str | torch.device


class TrajectoryBatch(NamedTuple):
    """Time-major sub-trajectories: obs (H+1, B, obs_dim), action (H, B, A), reward (H, B, 1),
    terminated (H, B, 1) float (1.0 where the transition ended the episode by termination)."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor

    def to(self, device: Device, non_blocking: bool = False) -> TrajectoryBatch:
        return TrajectoryBatch(*(t.to(device, non_blocking=non_blocking) for t in self))


class EpisodeBuffer:
    """Ring buffer of whole episodes with fixed-size storage.

    Args: capacity (rows = transitions + one final observation per episode), obs_dim,
    action_dim, device for storage, obs_dtype (e.g. torch.uint8 for pixels).

    Example:
        >>> buf = EpisodeBuffer(capacity=1000, obs_dim=3, action_dim=2)
        >>> T = 10
        >>> buf.add_episode(torch.randn(T + 1, 3), torch.rand(T, 2), torch.randn(T), torch.zeros(T))
        >>> batch = buf.sample(batch_size=4, horizon=3, generator=torch.Generator().manual_seed(0))
        >>> batch.obs.shape, batch.action.shape, batch.reward.shape
        (torch.Size([4, 4, 3]), torch.Size([3, 4, 2]), torch.Size([3, 4, 1]))
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        action_dim: int,
        device: Device = "cpu",
        obs_dtype: torch.dtype = torch.float32,
    ):
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2, got {capacity}")
        self.capacity, self.obs_dim, self.action_dim = capacity, obs_dim, action_dim
        self.device = torch.device(device)
        self._obs = torch.zeros(capacity, obs_dim, dtype=obs_dtype, device=self.device)
        self._action = torch.zeros(capacity, action_dim, device=self.device)
        self._reward = torch.zeros(capacity, 1, device=self.device)
        self._terminated = torch.zeros(capacity, 1, dtype=torch.bool, device=self.device)
        self._episodes: list[tuple[int, int]] = []  # (first row, num transitions), oldest first
        self._next_row = 0
        self.num_added_episodes = 0
        self.num_added_transitions = 0

    def __len__(self) -> int:
        """Transitions currently stored."""
        return sum(T for _, T in self._episodes)

    @property
    def num_episodes(self) -> int:
        """Episodes currently stored."""
        return len(self._episodes)

    def add_episode(
        self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor
    ) -> None:
        """Store one finished episode: obs (T+1, obs_dim), actions (T, A), rewards (T,) or
        (T, 1), terminated (T,) or (T, 1) (bool or 0/1). Evicts the oldest overlapping
        episodes when the storage is full."""
        T = actions.shape[0]
        if T < 1 or obs.shape[0] != T + 1:
            raise ValueError(f"need T >= 1 actions and T+1 observations; got {actions.shape[0]} and {obs.shape[0]}")
        if rewards.reshape(-1).shape[0] != T or terminated.reshape(-1).shape[0] != T:
            raise ValueError("rewards and terminated must have one entry per action")
        if T + 1 > self.capacity:
            raise ValueError(f"episode of {T + 1} rows does not fit in capacity {self.capacity}")
        start = self._next_row if self._next_row + T + 1 <= self.capacity else 0
        end = start + T + 1
        # evict every stored episode whose rows overlap [start, end)
        self._episodes = [(s, n) for s, n in self._episodes if s + n + 1 <= start or s >= end]
        rows = slice(start, end)
        self._obs[rows] = obs.to(self.device, self._obs.dtype)
        self._action[start : end - 1] = actions.to(self.device, torch.float32).reshape(T, self.action_dim)
        self._reward[start : end - 1] = rewards.to(self.device, torch.float32).reshape(T, 1)
        self._terminated[start : end - 1] = terminated.to(self.device).reshape(T, 1).bool()
        self._episodes.append((start, T))
        self._next_row = end % self.capacity
        self.num_added_episodes += 1
        self.num_added_transitions += T

    def state_dict(self) -> dict[str, Any]:
        """Stored rows and counters, for a checkpoint (rows past the last episode are left out)."""
        high = max((s + T + 1 for s, T in self._episodes), default=0)

        def rows(t: torch.Tensor) -> torch.Tensor:  # a copy: saving a view would save the whole storage
            return t[:high].clone() if high < self.capacity else t

        return {
            "capacity": self.capacity,
            "obs": rows(self._obs),
            "action": rows(self._action),
            "reward": rows(self._reward),
            "terminated": rows(self._terminated),
            "episodes": torch.tensor(self._episodes, dtype=torch.long).reshape(-1, 2),
            "next_row": self._next_row,
            "num_added_episodes": self.num_added_episodes,
            "num_added_transitions": self.num_added_transitions,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved into a buffer of the same capacity and shapes."""
        if (
            state["capacity"] != self.capacity
            or state["obs"].shape[1:] != self._obs.shape[1:]
            or state["action"].shape[1:] != self._action.shape[1:]
        ):
            raise ValueError(
                f"buffer of capacity {state['capacity']}, obs {tuple(state['obs'].shape[1:])}, "
                f"action {tuple(state['action'].shape[1:])} does not fit this one "
                f"(capacity {self.capacity}, obs ({self.obs_dim},), action ({self.action_dim},))"
            )
        high = state["obs"].shape[0]
        for mine, saved in (
            (self._obs, state["obs"]),
            (self._action, state["action"]),
            (self._reward, state["reward"]),
            (self._terminated, state["terminated"]),
        ):
            mine[:high] = saved.to(self.device, mine.dtype)
        self._episodes = [(int(s), int(T)) for s, T in state["episodes"].tolist()]
        self._next_row = int(state["next_row"])
        self.num_added_episodes = int(state["num_added_episodes"])
        self.num_added_transitions = int(state["num_added_transitions"])

    @staticmethod
    def episodes_of(state: dict[str, Any]) -> list[tuple[torch.Tensor, ...]]:
        """The episodes of a saved buffer, oldest first, as ``add_episode`` takes them: (obs, actions, rewards,
        terminated)."""
        return [
            (
                state["obs"][s : s + T + 1],
                state["action"][s : s + T],
                state["reward"][s : s + T],
                state["terminated"][s : s + T],
            )
            for s, T in state["episodes"].tolist()
        ]

    def extend(self, episodes: list[tuple[torch.Tensor, ...]]) -> None:
        """Add ``episodes`` oldest first (the oldest overwritten beyond the capacity)."""
        for episode in episodes:
            self.add_episode(*episode)

    def num_starts(self, horizon: int) -> int:
        """Valid sub-trajectory start positions for this horizon (0 means cannot sample)."""
        return sum(max(T - horizon + 1, 0) for _, T in self._episodes)

    def sample(
        self, batch_size: int, horizon: int, generator: torch.Generator | None = None, device: Device | None = None
    ) -> TrajectoryBatch:
        """B sub-trajectories of H+1 observations / H transitions, each inside one episode,
        drawn uniformly (with replacement) over valid start positions. ``generator``: a CPU
        ``torch.Generator`` (per-rank seeded by the caller), else the global RNG. ``device``:
        where the returned tensors go (default: storage device)."""
        firsts = torch.tensor([s for s, _ in self._episodes], dtype=torch.long)
        counts = torch.tensor([max(T - horizon + 1, 0) for _, T in self._episodes], dtype=torch.long)
        total = int(counts.sum()) if len(self._episodes) else 0
        if total == 0:
            raise ValueError(f"no episode with at least {horizon} transitions stored yet")
        # k-th valid start overall -> (episode, offset): searchsorted over cumulative counts
        k = torch.randint(total, (batch_size,), generator=generator)
        cum = counts.cumsum(0)
        ep = torch.searchsorted(cum, k, right=True)
        offset = k - (cum[ep] - counts[ep])
        start = firsts[ep] + offset  # (B,)
        rows = (start[None, :] + torch.arange(horizon + 1)[:, None]).to(self.device)  # (H+1, B)
        batch = TrajectoryBatch(
            obs=self._obs[rows],  # storage dtype (float32 unless obs_dtype said otherwise)
            action=self._action[rows[:-1]],
            reward=self._reward[rows[:-1]],
            terminated=self._terminated[rows[:-1]].float(),
        )
        return batch if device is None else batch.to(device)
