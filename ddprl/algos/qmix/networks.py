"""QMIX's networks: one agent network shared by all agents, the mixers, an observation encoder.

Shapes: B episodes, T steps, A agents, U actions, O observation features, S state features.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class AgentNet(nn.Module):
    """Q-values of one agent from its inputs; the same weights serve every agent (the agent id is
    part of the input). ``fc1 -> relu -> GRUCell | (linear -> relu) -> fc2``, as in PyMARL."""

    def __init__(self, in_dim: int, n_actions: int, hidden_dim: int, use_rnn: bool):
        super().__init__()
        self.hidden_dim, self.use_rnn = hidden_dim, use_rnn
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.rnn = nn.GRUCell(hidden_dim, hidden_dim) if use_rnn else nn.Linear(hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, n_actions)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step: ``x`` (N, in_dim), ``h`` (N, hidden) or None (zeros) -> Q (N, U), next ``h``."""
        y = F.relu(self.fc1(x))
        if self.use_rnn:
            h = self.rnn(y, h)
            return self.fc2(h), h
        return self.fc2(F.relu(self.rnn(y))), None

    def unroll(self, x: torch.Tensor) -> torch.Tensor:
        """Whole episodes from their first step: ``x`` (B, T, A, in_dim) -> Q (B, T, A, U)."""
        b, t, a, _ = x.shape
        if not self.use_rnn:  # no memory: all steps at once
            return self(x.reshape(b * t * a, -1))[0].view(b, t, a, -1)
        h = None
        out = []
        for i in range(t):
            q, h = self(x[:, i].reshape(b * a, -1), h)
            out.append(q.view(b, a, -1))
        return torch.stack(out, dim=1)


class QMixer(nn.Module):
    """Monotonic mixing: Q_tot = elu(q . |W1(s)| + b1(s)) . |w2(s)| + V(s) (Rashid et al. 2018).

    The weights come from hypernetworks of the state and pass through abs(), so
    dQ_tot/dQ_a >= 0: the greedy joint action is the agents' greedy actions.
    """

    def __init__(self, n_agents: int, state_dim: int, embed_dim: int, hypernet_layers: int, hypernet_embed: int):
        super().__init__()
        self.n_agents, self.state_dim, self.embed_dim = n_agents, state_dim, embed_dim

        def hyper(out: int) -> nn.Module:
            if hypernet_layers == 1:
                return nn.Linear(state_dim, out)
            return nn.Sequential(nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, out))

        self.hyper_w1 = hyper(embed_dim * n_agents)
        self.hyper_w2 = hyper(embed_dim)
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_v = nn.Sequential(nn.Linear(state_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))

    def forward(self, agent_qs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """``agent_qs`` (B, T, A), ``states`` (B, T, S) -> Q_tot (B, T)."""
        b, t, a = agent_qs.shape
        s = states.reshape(b * t, -1)
        w1 = self.hyper_w1(s).abs().view(b * t, a, self.embed_dim)
        b1 = self.hyper_b1(s).view(b * t, 1, self.embed_dim)
        hidden = F.elu(torch.bmm(agent_qs.reshape(b * t, 1, a), w1) + b1)
        w2 = self.hyper_w2(s).abs().view(b * t, self.embed_dim, 1)
        v = self.hyper_v(s).view(b * t, 1, 1)
        return (torch.bmm(hidden, w2) + v).view(b, t)


class VDNMixer(nn.Module):
    """Q_tot = sum of the agents' Qs (Sunehag et al. 2018): no parameters."""

    def forward(self, agent_qs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        return agent_qs.sum(dim=-1)


class Encoder(nn.Module):
    """An observation encoder, ``O -> hidden -> encoder_dim`` (staged training pretrains it)."""

    def __init__(self, obs_dim: int, hidden_dim: int, out_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, out_dim), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class Decoder(nn.Module):
    """The encoder's mirror for the autoencoder stage: ``encoder_dim -> hidden -> O``."""

    def __init__(self, in_dim: int, hidden_dim: int, obs_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, obs_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def agent_inputs(
    features: torch.Tensor, last_actions: torch.Tensor | None, n_actions: int, agent_id: bool
) -> torch.Tensor:
    """What the agent network reads: features (..., A, F) [+ one-hot last action] [+ one-hot agent id].

    ``last_actions`` (..., A) int64 with -1 for "none yet" (the first step), or None (not used).
    """
    parts = [features]
    if last_actions is not None:
        parts.append(
            F.one_hot(last_actions.clamp_min(0), n_actions).to(features.dtype)
            * (last_actions >= 0).unsqueeze(-1).to(features.dtype)
        )
    if agent_id:
        a = features.shape[-2]
        parts.append(torch.eye(a, dtype=features.dtype, device=features.device).expand(*features.shape[:-1], a))
    return torch.cat(parts, dim=-1) if len(parts) > 1 else features


class QNetwork(nn.Module):
    """The modules a qmix stage trains, in one module so that one DDP forward covers them all.

    ``encoder`` is a child only when this stage fine-tunes it; a frozen encoder is held outside
    the module tree (``frozen_encoder``), so DDP neither wraps nor synchronises it.
    """

    def __init__(
        self,
        agent: AgentNet,
        mixer: nn.Module | None,
        n_actions: int,
        agent_id: bool,
        last_action: bool,
        encoder: Encoder | None = None,
        frozen_encoder: Encoder | None = None,
    ):
        super().__init__()
        self.agent, self.mixer, self.encoder = agent, mixer, encoder
        self._frozen = (frozen_encoder,)  # a tuple: not registered as a submodule
        self.n_actions, self.agent_id, self.last_action = n_actions, agent_id, last_action

    @property
    def frozen_encoder(self) -> Encoder | None:
        return self._frozen[0]

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.frozen_encoder is not None:
            with torch.no_grad():
                obs = self.frozen_encoder(obs)
        return self.encoder(obs) if self.encoder is not None else obs

    def inputs(self, obs: torch.Tensor, last_actions: torch.Tensor | None) -> torch.Tensor:
        return agent_inputs(
            self.features(obs), last_actions if self.last_action else None, self.n_actions, self.agent_id
        )

    def agent_qs(self, obs: torch.Tensor, last_actions: torch.Tensor | None) -> torch.Tensor:
        """Every agent's Qs for whole episodes: obs (B, T, A, O) -> (B, T, A, U)."""
        return self.agent.unroll(self.inputs(obs, last_actions))

    def mix(self, qs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """(B, T, A) chosen Qs -> Q_tot (B, T); without a mixer, the agents' Qs unchanged (B, T, A)."""
        return qs if self.mixer is None else self.mixer(qs, states)

    def forward(
        self, obs: torch.Tensor, last_actions: torch.Tensor | None, actions: torch.Tensor, states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training forward: obs (B, T+1, A, O), actions (B, T, A), states (B, T+1, S) ->
        (Q_tot of the taken actions (B, T) [or (B, T, A) without a mixer], every Q (B, T+1, A, U))."""
        qs = self.agent_qs(obs, last_actions)
        chosen = qs[:, :-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return self.mix(chosen, states[:, :-1]), qs


class Autoencoder(nn.Module):
    """The pretraining stage's module: observations -> encoder -> decoder -> reconstruction."""

    def __init__(self, encoder: Encoder, decoder: Decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(obs))
