"""QMIX's keys (values: ``defaults.yaml`` beside this file). ``ddprl keys algo=qmix`` lists them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ddprl.config.schema import RLConfig, _check, key

MIXERS = ("qmix", "vdn", "none")
STAGES = ("qmix", "tokenizer", "mask_predictor", "pretrain")
GRAPH_STAGES = ("tokenizer", "mask_predictor")  # stages of the graph reconstructer (reconstruct.py)
MASK_LOSSES = ("ce", "hungarian")


def is_graph_stage(stage: str) -> bool:
    """Whether ``stage`` runs the pretraining loop (a built-in graph stage, or a user's ``module:Class``)."""
    return stage in GRAPH_STAGES or ":" in stage


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
        "rank<r>.pt); a resume then needs no warm-up (on another number of ranks they are dealt out anew)"
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
    stage: str = key(
        "qmix | tokenizer (stage 1: a VQ-VAE over observation nodes) | mask_predictor (stage 2: predict "
        "the tokens of unseen nodes) | pipeline (tokenizer, mask_predictor, then qmix reconstruct=true, one "
        "run directory each under run_dir) | pretrain (an observation autoencoder on collected episodes) | "
        "package.module:Class (a stage of your own)"
    )
    init_from: str = key("checkpoint whose networks initialise this stage ('' : none)")
    encoder_dim: int = key("observation encoder output width (0: no encoder, the agent reads raw observations)")
    freeze_encoder: bool = key("keep the encoder fixed in the qmix stage (false: fine-tune it)")
    reconstruct: bool = key(
        "stage qmix: fill in every node the agent cannot see with the frozen reconstructer of init_from "
        "(a stage=mask_predictor checkpoint) before the agent network"
    )
    full_obs: bool = key("stage qmix: act and learn on the observation with unlimited sight (the oracle)")
    # -- graph reconstructer (stages tokenizer and mask_predictor) ------------------------------------
    pretrain_episodes: int = key(
        "episodes of random play collected for stages tokenizer and mask_predictor, in the whole job "
        "(each rank plays its share); a tenth as many more are held out for validation"
    )
    epochs: int = key("stages tokenizer and mask_predictor: passes over the collected observations")
    node_batch_size: int = key(
        "stages tokenizer and mask_predictor: observations (one agent at one step) per rank per optimizer step"
    )
    num_codes: int = key("tokenizer: codebook size")
    code_dim: int = key("tokenizer: code width")
    node_hidden: int = key("tokenizer: width of the node encoder's and decoder's hidden layers")
    codebook_decay: float = key("tokenizer: EMA decay of the codebook's statistics")
    commitment: float = key("tokenizer: weight of the commitment loss (encoder output to its code)")
    revive_below: float = key(
        "tokenizer: a code whose EMA count falls below this is moved onto a recent encoder output (0: never)"
    )
    d_model: int = key("mask_predictor: transformer width")
    n_heads: int = key("mask_predictor: attention heads")
    n_layers: int = key("mask_predictor: transformer layers")
    ffn_dim: int = key("mask_predictor: feed-forward width")
    dropout: float = key("mask_predictor: dropout")
    mask_ratio: float = key(
        "mask_predictor: besides every unseen node, random seen nodes are masked until this fraction of the "
        "non-SELF nodes is"
    )
    mask_loss: str = key(
        "mask_predictor: ce (cross-entropy per node) | hungarian (the best matching within each node type)"
    )

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
        _check(
            self.stage in STAGES or ":" in self.stage,
            f"stage={self.stage!r} is not one of {', '.join(STAGES)} or package.module:StageClass",
        )
        _check(self.encoder_dim >= 0, f"encoder_dim={self.encoder_dim} must be >= 0")
        _check(
            self.stage != "pretrain" or self.encoder_dim > 0,
            "stage=pretrain trains the observation encoder: give encoder_dim > 0",
        )
        for name in ("pretrain_episodes", "epochs", "node_batch_size", "num_codes", "code_dim", "node_hidden"):
            _check(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        for name in ("d_model", "n_heads", "n_layers", "ffn_dim"):
            _check(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be >= 1")
        _check(self.d_model % self.n_heads == 0, f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        _check(0 < self.codebook_decay < 1, f"codebook_decay={self.codebook_decay} must be in (0, 1)")
        _check(self.commitment >= 0, f"commitment={self.commitment} must be >= 0")
        _check(self.revive_below >= 0, f"revive_below={self.revive_below} must be >= 0")
        _check(0 <= self.dropout < 1, f"dropout={self.dropout} must be in [0, 1)")
        _check(0 <= self.mask_ratio <= 1, f"mask_ratio={self.mask_ratio} must be in [0, 1]")
        _check(self.mask_loss in MASK_LOSSES, f"mask_loss={self.mask_loss!r} is not one of {', '.join(MASK_LOSSES)}")
        _check(
            not (self.reconstruct and self.full_obs),
            "reconstruct=true fills in the sight-limited observation and full_obs=true replaces it: give one",
        )
        _check(
            self.stage == "qmix" or not (self.reconstruct or self.full_obs),
            f"reconstruct and full_obs are keys of stage=qmix, not stage={self.stage}",
        )
        _check(
            not (self.reconstruct and self.encoder_dim > 0),
            "reconstruct=true puts the reconstructer before the agent network: leave encoder_dim at 0",
        )

    def check_task(self) -> None:
        from ddprl.envs.marl import check_marl_task

        check_marl_task(self.task)

    def check(self) -> list[str]:
        from ddprl.envs.marl import make_marl_env

        self.check_task()
        if is_graph_stage(self.stage):
            from ddprl.algos.qmix.graph_stages import stage_named

            stage_named(self.stage)  # a user's stage that does not load is refused here
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
        env = make_marl_env(self.task, 1, seed=0, device="cpu", **self.env_options())
        try:
            if is_graph_stage(self.stage) or self.reconstruct:
                _check(
                    getattr(env, "node_layout", None) is not None,
                    f"stage={self.stage}{' reconstruct=true' if self.reconstruct else ''} needs an observation "
                    f"made of unit blocks (a node layout); {self.task} has none: use a SMAX battle, e.g. smax/3m",
                )
            if self.init_from and not self.resume:
                self._check_init_from(env)
            elif not self.resume and self.reconstruct:
                _check(False, "reconstruct=true needs init_from=<a stage=mask_predictor checkpoint>")
            elif not self.resume and is_graph_stage(self.stage):
                from ddprl.algos.qmix.graph_stages import stage_named

                takes = stage_named(self.stage).takes
                what = (
                    "a stage=tokenizer checkpoint"
                    if self.stage == "mask_predictor"
                    else f"a checkpoint with {', '.join(takes)}"
                )
                _check(not takes, f"stage={self.stage} needs init_from=<{what}>")
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

    def env_options(self) -> dict[str, Any]:
        """The env's keyword arguments: ``env_kwargs``, and the full observation where this stage reads it."""
        if is_graph_stage(self.stage) or self.full_obs:
            return {**self.env_kwargs, "full_obs": True}
        return dict(self.env_kwargs)

    def _check_init_from(self, env: Any) -> None:
        from ddprl.algos.qmix.graph_stages import build_reconstructer, reconstructer_state, stage_named
        from ddprl.algos.qmix.stage import build_networks, init_from_checkpoint
        from ddprl.checkpoint import load_checkpoint

        ckpt = load_checkpoint(self.init_from, expect_algo="qmix")
        if self.reconstruct or is_graph_stage(self.stage):
            _check(
                ckpt["config"].get("task") == self.task,
                f"init_from={self.init_from} was trained on {ckpt['config'].get('task')}, this job runs {self.task}: "
                "a reconstructer fits the task whose observations it learned",
            )
        if self.reconstruct:
            build_reconstructer(reconstructer_state(ckpt), env.node_layout, f"init_from={self.init_from}")
            return
        if is_graph_stage(self.stage):
            import torch

            from ddprl.algos.qmix.graph_stages import StageContext
            from ddprl.algos.qmix.pretrain import load_taken

            stage = stage_named(self.stage)
            have = ckpt["state"].get("networks", {})
            lacking = [name for name in stage.takes if name not in have]
            _check(
                not lacking,
                f"init_from={self.init_from} (a stage={ckpt['config'].get('stage')} checkpoint) has no "
                f"{', '.join(lacking)}: stage={self.stage} needs {', '.join(stage.takes)} from an earlier stage",
            )
            layout = env.node_layout
            modules = stage.build(StageContext(layout, self, torch.zeros(3, layout.width)))
            load_taken(stage, modules, self.init_from)  # refused here when they do not fit
            return
        networks = ckpt["state"]["networks"]
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
