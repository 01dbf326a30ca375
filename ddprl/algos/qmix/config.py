"""QMIX's keys (values: ``defaults.yaml`` beside this file). ``ddprl keys algo=qmix`` lists them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ddprl.config.schema import RLConfig, _check, key

MIXERS = ("qmix", "vdn", "none")
STAGES = ("qmix", "pretrain")


@dataclass(kw_only=True)
class QMIXConfig(RLConfig):
    # -- learning schedule ------------------------------------------------------------------
    buffer_size: int = key("episodes kept in replay, in the whole job (each rank keeps buffer_size/world_size)")
    update_every: Optional[int] = key(
        "global env steps between learner updates (null: the task's episode "
        "limit, i.e. one update per full-length episode like EPyMARL)"
    )
    lr: float = key("Adam learning rate")
    gamma: float = key("discount")
    td_lambda: float = key("TD(lambda) targets; 0: one-step targets (EPyMARL's QMIX)")
    bootstrap_truncated: bool = key(
        "bootstrap time-limit ends from the next observation's value (false: treat "
        "them as terminal, as EPyMARL does for gym envs such as LBF and RWARE)"
    )
    double_q: bool = key("pick the next action with the live network, value it with the target network")
    target_update_interval: int = key("learner updates between hard target-network copies")
    standardise_rewards: bool = key("standardise rewards with running mean/std over all ranks' sampled batches")
    standardise_state: bool = key(
        "feed the mixer states standardised with running mean/std over all ranks' sampled states (EPyMARL: raw states)"
    )
    max_grad_norm: float = key("gradient-norm clip (0: off)")
    epsilon_start: float = key("exploration epsilon at step 0")
    epsilon_finish: float = key("epsilon after the anneal (greedy, epsilon 0, at evaluation)")
    epsilon_anneal_steps: int = key("global env steps of the linear epsilon anneal")
    log_freq: int = key("global env steps between metric rows")
    checkpoint_buffer: bool = key(
        "save each rank's episode replay with every checkpoint (checkpoints/buffers/"
        "rank<r>.pt); a resume on as many ranks then needs no warm-up"
    )
    # -- networks -----------------------------------------------------------------------------
    use_rnn: bool = key("GRU agent network (false: feed-forward, EPyMARL's QMIX default)")
    hidden_dim: int = key("agent network width")
    obs_agent_id: bool = key("append the agent's one-hot id to its observation (one network for all agents)")
    obs_last_action: bool = key("append the agent's previous action (one-hot) to its observation")
    mixer: str = key("qmix (monotonic hypernetwork mixer) | vdn (sum) | none (independent Q-learning)")
    mixing_embed_dim: int = key("QMIX mixing-network width")
    hypernet_layers: int = key("1 | 2 layers in the hypernetworks producing the mixing weights")
    hypernet_embed: int = key("hidden width of 2-layer hypernetworks")
    env_kwargs: dict[str, Any] = key("keyword arguments for the environment (time_limit, action_masks, ...)")
    # -- staged training ----------------------------------------------------------------------
    stage: str = key("qmix | pretrain (train an observation autoencoder on collected episodes)")
    init_from: str = key("checkpoint whose networks initialise this stage ('' : none)")
    encoder_dim: int = key("observation encoder output width (0: no encoder, the agent reads raw observations)")
    freeze_encoder: bool = key("keep the encoder fixed in the qmix stage (false: fine-tune it)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.buffer_size >= 1, f"buffer_size={self.buffer_size} must be >= 1")
        _check(
            self.update_every is None or self.update_every >= 1,
            f"update_every={self.update_every} must be >= 1 or null",
        )
        _check(self.lr > 0, f"lr={self.lr} must be > 0")
        _check(0 <= self.gamma <= 1, f"gamma={self.gamma} must be in [0, 1]")
        _check(0 <= self.td_lambda <= 1, f"td_lambda={self.td_lambda} must be in [0, 1]")
        _check(self.target_update_interval >= 1, f"target_update_interval={self.target_update_interval} must be >= 1")
        _check(self.max_grad_norm >= 0, f"max_grad_norm={self.max_grad_norm} must be >= 0")
        for name in ("epsilon_start", "epsilon_finish"):
            _check(0 <= getattr(self, name) <= 1, f"{name}={getattr(self, name)} must be in [0, 1]")
        _check(self.epsilon_anneal_steps >= 0, f"epsilon_anneal_steps={self.epsilon_anneal_steps} must be >= 0")
        _check(self.log_freq >= 1, f"log_freq={self.log_freq} must be >= 1")
        for name in ("hidden_dim", "mixing_embed_dim", "hypernet_embed"):
            _check(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        _check(self.mixer in MIXERS, f"mixer={self.mixer!r} is not one of {', '.join(MIXERS)}")
        _check(self.hypernet_layers in (1, 2), f"hypernet_layers={self.hypernet_layers} must be 1 or 2")
        _check(self.stage in STAGES, f"stage={self.stage!r} is not one of {', '.join(STAGES)}")
        _check(self.encoder_dim >= 0, f"encoder_dim={self.encoder_dim} must be >= 0")
        _check(
            self.stage != "pretrain" or self.encoder_dim > 0,
            "stage=pretrain trains the observation encoder: give encoder_dim > 0",
        )

    def check_task(self) -> None:
        from ddprl.envs.marl import check_marl_task

        check_marl_task(self.task)

    def check(self) -> list[str]:
        from ddprl.envs.marl import make_marl_env

        self.check_task()
        warnings = self.schedule_warnings()
        _check(
            self.buffer_size % self.world_size == 0 and self.buffer_size // self.world_size >= self.batch_size,
            f"buffer_size={self.buffer_size} must be a multiple of world_size={self.world_size} and hold "
            f"batch_size={self.batch_size} episodes on every rank",
        )
        _check(
            not (
                self.stage == "qmix"
                and self.encoder_dim > 0
                and self.freeze_encoder
                and not self.init_from
                and not self.resume
            ),
            "freeze_encoder=true keeps the encoder as init_from gives it: give init_from=<a stage=pretrain "
            "checkpoint>, or freeze_encoder=false to train it with QMIX",
        )
        if self.init_from:
            from pathlib import Path

            _check(Path(self.init_from).is_file(), f"init_from={self.init_from}: no such checkpoint file")
        self._check_something_to_freeze()
        # One env (bad env_kwargs are refused here), and the networks init_from loads into,
        # built as every rank builds them: a checkpoint that does not fit is refused before
        # any rank starts.
        env = make_marl_env(self.task, 1, seed=0, device="cpu", **self.env_kwargs)
        try:
            if self.init_from and not self.resume:
                self._check_init_from(env)
            limit = env.episode_limit
        finally:
            env.close()
        warmup = self.warmup_iterations(limit, self.world_size) * self.num_envs  # global steps
        if self.stage == "qmix" and warmup >= self.steps:
            warnings.append(
                f"steps={self.steps} ends before the first update: every rank first collects "
                f"batch_size={self.batch_size} episodes, {warmup} global steps with episodes of up to "
                f"{limit} steps and {self.local_num_envs(self.world_size)} env(s) per rank (raise steps "
                "or num_envs, or lower batch_size)"
            )
        return warnings

    def warmup_iterations(self, episode_limit: int, world_size: int) -> int:
        """Steps of every env before the first update. Each env ends an episode at least every
        ``episode_limit`` steps, so by then every rank surely holds ``batch_size`` episodes: a
        rule of steps, not of buffer sizes, so that every rank starts updating at the same
        step without asking the others."""
        return episode_limit * math.ceil(self.batch_size / self.local_num_envs(world_size))

    def _check_something_to_freeze(self) -> None:
        """``freeze_encoder=true`` given on the command line (the default is true, and a run's
        config.yaml names every key) where this stage builds no encoder: refused, rather than
        trained as if the key had not been given."""
        given = self.sources.get("freeze_encoder") == "command line"
        if not (given and self.freeze_encoder and self.stage == "qmix" and self.encoder_dim == 0):
            return
        hint = "give encoder_dim=<its width> and init_from=<a stage=pretrain checkpoint>"
        if self.init_from:
            from ddprl.checkpoint import load_checkpoint

            ckpt = load_checkpoint(self.init_from, expect_algo="qmix")
            networks = ckpt["state"]["networks"]
            if "encoder" in networks:
                hint = f"give encoder_dim={ckpt['config'].get('encoder_dim')} to keep init_from's encoder"
            else:
                hint = f"init_from={self.init_from} has none either (it holds {', '.join(networks)}): {hint}"
        _check(
            False,
            f"freeze_encoder=true keeps an observation encoder fixed, but encoder_dim=0 builds none; {hint}, "
            "or leave freeze_encoder out",
        )

    def _check_init_from(self, env: Any) -> None:
        from ddprl.algos.qmix.stage import build_networks, init_from_checkpoint
        from ddprl.checkpoint import load_checkpoint

        networks = load_checkpoint(self.init_from, expect_algo="qmix")["state"]["networks"]
        keeps_encoder = self.stage == "qmix" and self.encoder_dim > 0 and self.freeze_encoder
        _check(
            not keeps_encoder or "encoder" in networks,
            f"freeze_encoder=true keeps init_from's encoder, but {self.init_from} has none (it holds "
            f"{', '.join(networks) or 'no networks'}): give init_from=<a stage=pretrain checkpoint>, "
            "or freeze_encoder=false to train a new encoder",
        )
        init_from_checkpoint(build_networks(self, env), self.init_from)

    def local_buffer_size(self, world_size: int) -> int:
        """Episodes each rank keeps (``buffer_size`` is global)."""
        return self.buffer_size // world_size
