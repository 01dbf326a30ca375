"""One QMIX update on one rank, and the small pieces it is made of (each tested alone).

The update is data-parallel without touching the process group: DDP averages the gradients
of the ranks' losses, and each rank's loss is normalised by the *global* number of valid
steps (``rt.all_reduce_sum``), so N ranks on N shares of a batch take exactly the step one
process takes on the whole batch, whatever the episode lengths on each rank.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from ddprl.algos.common import autocast_context
from ddprl.algos.qmix.networks import Autoencoder, QNetwork
from ddprl.normalize import RunningMeanStd

if TYPE_CHECKING:
    from ddprl.algos.qmix.config import QMIXConfig
    from ddprl.runtime.collectives import Runtime

UNAVAILABLE = -1e9  # a finite "minus infinity": masked values never turn into NaN (0 * inf)


def epsilon_at(step: int, start: float, finish: float, anneal_steps: int) -> float:
    """Linear anneal from ``start`` to ``finish`` over ``anneal_steps`` global env steps, then flat."""
    if anneal_steps <= 0:
        return finish
    return start + (finish - start) * min(1.0, step / anneal_steps)


def select_actions(
    qs: torch.Tensor, avail: torch.Tensor, epsilon: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Epsilon-greedy over the available actions: qs (N, A, U), avail (N, A, U) bool -> (N, A).

    With probability ``epsilon`` (per agent) an available action uniformly at random, else the
    available action of highest Q.
    """
    greedy = qs.masked_fill(~avail, UNAVAILABLE).argmax(-1)
    if epsilon <= 0:
        return greedy
    n, a, u = avail.shape
    random = torch.multinomial(avail.reshape(n * a, u).float(), 1, generator=generator).view(n, a)
    explore = torch.rand(n, a, device=qs.device, generator=generator) < epsilon
    return torch.where(explore, random, greedy)


def lambda_returns(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    filled: torch.Tensor,
    next_values: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """TD(lambda) targets of every step, computed backwards; lam=0 gives one-step targets.

    G_t = r_t + gamma (1 - term_t) [(1 - lam) V_{t+1} + lam G_{t+1}], where G_{t+1} is replaced
    by V_{t+1} after an episode's last step (a truncated episode bootstraps from the value of the
    observation it was cut at). ``next_values[:, t]`` is V of the step after t. All (B, T[, A]).
    Zero where not ``filled``.
    """
    if lam == 0:  # one-step targets: no recursion (EPyMARL's default; ~15% of an update otherwise)
        return (rewards + gamma * (~terminated) * next_values) * filled
    steps = rewards.shape[1]
    returns = torch.zeros_like(next_values)
    for t in reversed(range(steps)):
        if t + 1 < steps:
            following = torch.where(filled[:, t + 1], returns[:, t + 1], next_values[:, t])
        else:
            following = next_values[:, t]
        g = rewards[:, t] + gamma * (~terminated[:, t]) * ((1 - lam) * next_values[:, t] + lam * following)
        returns[:, t] = g * filled[:, t]
    return returns


def _agent_dim(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a (B, T) tensor over the agents when the Qs are per agent (no mixer)."""
    return x.unsqueeze(-1).expand_as(like) if like.dim() == 3 else x


def episode_ends(filled: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the last step of each stored episode (every stored episode has ended)."""
    following = torch.cat([filled[:, 1:], torch.zeros_like(filled[:, :1])], dim=1)
    return filled & ~following


def last_actions_of(actions: torch.Tensor) -> torch.Tensor:
    """(B, T, A) actions -> (B, T+1, A) the action before each step, -1 at the first step."""
    return torch.cat([torch.full_like(actions[:, :1], -1), actions], dim=1)


class QLearner:
    """The QMIX stage's learner: live network (DDP-wrapped), target network, optimizer, reward stats."""

    def __init__(self, rt: Runtime, cfg: QMIXConfig, net: QNetwork):
        self.rt, self.cfg = rt, cfg
        self.model = rt.wrap(net, compile=cfg.compile)  # every module this stage trains, one forward
        self.net: QNetwork = rt.unwrap(self.model)
        self.target = copy.deepcopy(self.net)  # after wrap: the broadcast weights (invariant 2)
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(
            [p for p in self.model.parameters() if p.requires_grad], lr=cfg.lr, foreach=True
        )
        self.scaler = torch.amp.GradScaler(rt.device.type, enabled=cfg.precision == "fp16")
        self.reward_stats = RunningMeanStd((), clip=float("inf")).to(rt.device)
        self.state_stats = RunningMeanStd(
            (net.mixer.state_dim,) if hasattr(net.mixer, "state_dim") else (0,), clip=float("inf")
        ).to(rt.device)
        self.updates = 0

    def update_target(self) -> None:
        self.target.load_state_dict(self.net.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "reward_stats": self.reward_stats.state_dict(),
            "state_stats": self.state_stats.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.reward_stats.load_state_dict(state["reward_stats"])
        self.state_stats.load_state_dict(state["state_stats"])

    def loss_terms(self, batch: dict[str, torch.Tensor], global_filled: torch.Tensor) -> dict[str, torch.Tensor]:
        """The TD loss of one batch, normalised by ``global_filled`` valid steps of all ranks' batches."""
        cfg = self.cfg
        rewards = batch["reward"]
        if cfg.standardise_rewards:
            rewards = (rewards - self.reward_stats.mean.float()) / (self.reward_stats.var.float().sqrt() + 1e-8)
        last = last_actions_of(batch["actions"])
        states = batch["state"]
        if cfg.standardise_state and cfg.mixer == "qmix":
            states = (states - self.state_stats.mean.float()) / (self.state_stats.var.float().sqrt() + 1e-8)
        with autocast_context(self.rt.device, cfg.precision):
            chosen, qs = self.model(batch["obs"], last, batch["actions"], states)
        chosen, qs = chosen.float(), qs.float()
        with torch.no_grad():
            next_avail = batch["avail"][:, 1:]
            target_qs = self.target.agent_qs(batch["obs"], last)[:, 1:].float()
            # Double Q: the live network picks the next action, the target network values it.
            picker = qs[:, 1:].detach() if cfg.double_q else target_qs
            next_actions = picker.masked_fill(~next_avail, UNAVAILABLE).argmax(-1, keepdim=True)
            next_q = target_qs.gather(-1, next_actions).squeeze(-1)
            next_values = self.target.mix(next_q, states[:, 1:]).float()
            filled = _agent_dim(batch["filled"], chosen)
            terminated = batch["terminated"]
            if not cfg.bootstrap_truncated:  # EPyMARL on gym envs: a time-out ends the return like a terminal state
                terminated = terminated | episode_ends(batch["filled"])
            targets = lambda_returns(
                _agent_dim(rewards, chosen),
                _agent_dim(terminated, chosen),
                filled,
                next_values,
                cfg.gamma,
                cfg.td_lambda,
            )
        td = (chosen - targets) * filled
        # DDP averages gradients over ranks: scaling by world_size / (valid steps of all ranks)
        # makes the average the gradient of the whole batch's mean squared TD error.
        loss = (td**2).sum() * (self.rt.world_size / global_filled)
        n = filled.sum()
        return {
            "loss": loss,
            "td_error_abs": td.abs().sum() / n.clamp_min(1),
            "q_taken_mean": (chosen * filled).sum() / n.clamp_min(1),
            "target_mean": (targets * filled).sum() / n.clamp_min(1),
        }

    def update(self, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """One optimizer step on ``sync_freq`` batches of this rank (the first k-1 under no_sync).

        The loss is normalised by the valid steps of all k batches of all ranks, so k batches on
        N ranks take the step of one batch made of all of them. Returns this rank's metrics
        (means over its batches); the caller reduces them.
        """
        cfg, rt = self.cfg, self.rt
        # Every global statistic of this step's batches in one all-reduce (each collective costs
        # ~1-2 ms over gloo on a CPU: more than the update's compute at small batches).
        parts = [sum(b["filled"].sum() for b in batches).double().view(1)]
        if cfg.standardise_rewards:  # rewards of the valid steps of every rank
            parts.append(self.reward_stats.moments(torch.cat([b["reward"][b["filled"]] for b in batches])))
        mix_state = cfg.standardise_state and cfg.mixer == "qmix"
        if mix_state:  # the mixer's input, in units of its spread over all ranks' sampled states
            observed = [b["state"][torch.cat([b["filled"], b["filled"][:, -1:]], 1)] for b in batches]
            parts.append(self.state_stats.moments(torch.cat(observed)))
        sizes = [len(p) for p in parts]
        reduced = list(rt.all_reduce_sum(torch.cat(parts)).split(sizes))
        global_filled = reduced.pop(0).float()
        if cfg.standardise_rewards:
            self.reward_stats.update_from_moments(reduced.pop(0))
        if mix_state:
            self.state_stats.update_from_moments(reduced.pop(0))
        per_step = batches[0]["actions"].shape[-1] if cfg.mixer == "none" else 1  # a TD error per agent
        global_filled = (global_filled * per_step).clamp_min(1)
        sums: dict[str, float] = {}
        for i, batch in enumerate(batches):
            with rt.no_sync(self.model, enabled=i < len(batches) - 1):
                terms = self.loss_terms(batch, global_filled)
                self.scaler.scale(terms["loss"]).backward()
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach()) / len(batches)
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        if self.updates % cfg.target_update_interval == 0:  # the same update count on every rank
            self.update_target()
        sums["grad_norm"] = float(grad_norm)
        return sums


class AutoencoderLearner:
    """The pretraining stage's learner: reconstruct observations through the encoder (MSE)."""

    def __init__(self, rt: Runtime, cfg: QMIXConfig, autoencoder: Autoencoder):
        self.rt, self.cfg = rt, cfg
        self.model = rt.wrap(autoencoder, compile=cfg.compile)  # only what this stage trains
        self.net: Autoencoder = rt.unwrap(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def update(self, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """One optimizer step on this rank's ``sync_freq`` batches: mean squared reconstruction
        error of every agent's observation at every valid step of all ranks' batches."""
        rt = self.rt
        local_count = sum(b["filled"].sum() * b["obs"].shape[2] for b in batches).float()  # (step, agent) pairs
        global_count = rt.all_reduce_sum(local_count).clamp_min(1)
        local_err = 0.0
        for i, batch in enumerate(batches):
            obs = batch["obs"][:, :-1]  # the observations acted on (the last one is a bootstrap's)
            mask = batch["filled"][..., None, None].to(obs.dtype)
            with rt.no_sync(self.model, enabled=i < len(batches) - 1):
                err = ((self.model(obs) - obs) ** 2 * mask).sum() / obs.shape[-1]
                (err * (rt.world_size / global_count)).backward()
            local_err += float(err.detach())
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        # The window sums this over ranks and divides by world_size: the global mean.
        return {"recon_mse": local_err * rt.world_size / float(global_count)}
