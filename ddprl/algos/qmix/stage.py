"""The networks of a QMIX stage: built as the architecture keys describe them for an env, and
loaded from a checkpoint (the run being resumed, or ``init_from``: another stage's).

``QMIXConfig.check`` builds them too, to refuse an ``init_from`` that does not fit before any
rank starts: this module names the keys it reads (:class:`Architecture`) rather than importing
the config.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ddprl.algos.qmix.networks import AgentNet, Decoder, Encoder, QMixer, QNetwork, VDNMixer
from ddprl.checkpoint import load_checkpoint
from ddprl.envs.marl.base import MultiAgentVecEnv
from ddprl.errors import UsageError


class Architecture(Protocol):
    """The keys of QMIX's config (``QMIXConfig``) that shape a stage's networks."""

    stage: str
    encoder_dim: int
    freeze_encoder: bool
    hidden_dim: int
    use_rnn: bool
    obs_agent_id: bool
    obs_last_action: bool
    mixer: str
    mixing_embed_dim: int
    hypernet_layers: int
    hypernet_embed: int


def build_networks(cfg: Architecture, env: MultiAgentVecEnv) -> dict[str, torch.nn.Module]:
    """Every module the config describes for ``env`` (fresh weights from this rank's generator)."""
    nets: dict[str, torch.nn.Module] = {}
    features = env.obs_dim
    if cfg.encoder_dim > 0:
        nets["encoder"] = Encoder(env.obs_dim, cfg.hidden_dim, cfg.encoder_dim)
        features = cfg.encoder_dim
    if cfg.stage == "pretrain":
        nets["decoder"] = Decoder(cfg.encoder_dim, cfg.hidden_dim, env.obs_dim)
        return nets
    in_dim = features + (env.n_actions if cfg.obs_last_action else 0) + (env.n_agents if cfg.obs_agent_id else 0)
    nets["agent"] = AgentNet(in_dim, env.n_actions, cfg.hidden_dim, cfg.use_rnn)
    if cfg.mixer == "qmix":
        nets["mixer"] = QMixer(
            env.n_agents, env.state_dim, cfg.mixing_embed_dim, cfg.hypernet_layers, cfg.hypernet_embed
        )
    elif cfg.mixer == "vdn":
        nets["mixer"] = VDNMixer()
    return nets


def q_network(cfg: Architecture, env: MultiAgentVecEnv, nets: dict[str, torch.nn.Module]) -> QNetwork:
    """The qmix stage's trained modules in one module; a frozen encoder stays outside it."""
    encoder = nets.get("encoder")
    frozen = encoder if encoder is not None and cfg.freeze_encoder else None
    if frozen is not None:
        frozen.requires_grad_(False)
    return QNetwork(
        nets["agent"],
        nets.get("mixer"),
        env.n_actions,
        cfg.obs_agent_id,
        cfg.obs_last_action,
        encoder=None if frozen is not None else encoder,
        frozen_encoder=frozen,
    )


def load_networks(
    nets: dict[str, torch.nn.Module], saved: dict[str, dict[str, torch.Tensor]], source: str, only_present: bool = False
) -> list[str]:
    """Load the saved modules into ``nets`` (by name); returns the names loaded.

    ``only_present``: modules the checkpoint lacks keep their weights (a stage initialised from
    an earlier stage, which trained fewer modules).
    """
    loaded = []
    for name, module in nets.items():
        if name not in saved:
            if only_present:
                continue
            raise UsageError(f"{source} has no {name} network")
        try:
            module.load_state_dict(saved[name])
        except RuntimeError as e:
            raise UsageError(
                f"{source}: its {name} network does not fit this config "
                f"({str(e).splitlines()[0][:160]}); use the same architecture keys"
            ) from None
        loaded.append(name)
    return loaded


def init_from_checkpoint(nets: dict[str, torch.nn.Module], path: str) -> list[str]:
    """Initialise this stage's modules from another stage's checkpoint (those it has)."""
    ckpt = load_checkpoint(path, expect_algo="qmix")
    names = load_networks(
        {k: v for k, v in nets.items() if k != "decoder"},
        ckpt["state"]["networks"],
        f"init_from={path}",
        only_present=True,
    )
    if not names:
        raise UsageError(f"init_from={path}: none of this stage's networks ({', '.join(nets)}) is in it")
    return names
