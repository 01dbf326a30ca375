"""TD-MPC2's keys (values: ``defaults.yaml`` beside this file). ``ddprl keys algo=tdmpc2`` lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ddprl.config.schema import RLConfig, _check, key


@dataclass(kw_only=True)
class TDMPC2Config(RLConfig):
    PER_RANK_BATCH = (
        "each rank updates once per transition it collects, so batch_size per rank is what keeps the samples "
        "learned from per environment step (docs/tdmpc2.md, the replay ratio)"
    )

    # -- model (docs/references.md#architecture; null dims come from model_size) -------------
    model_size: int = key("TD-MPC2 model size in millions of parameters: 1, 5, 19, 48 or 317")
    enc_dim: Optional[int] = key("encoder width (null: from model_size)")
    mlp_dim: Optional[int] = key("width of dynamics, reward, Q and policy MLPs (null: from model_size)")
    latent_dim: Optional[int] = key("latent size, a multiple of 8 for SimNorm (null: from model_size)")
    num_enc_layers: Optional[int] = key("encoder layers (null: from model_size)")
    num_q: Optional[int] = key("Q ensemble members, >= 2 (null: from model_size)")
    dropout: float = key("dropout on the first layer of each Q member")
    # -- planning (MPPI) ---------------------------------------------------------------------
    mpc: bool = key("act with the MPPI planner (false: with the policy prior alone)")
    horizon: int = key("planning and training horizon H in agent steps")
    iterations: Optional[int] = key("MPPI iterations (null: 6, or 8 when action_dim >= 20)")
    num_samples: int = key("MPPI trajectories per iteration")
    num_elites: int = key("MPPI elite trajectories refit each iteration")
    num_pi_trajs: int = key("MPPI trajectories proposed by the policy prior")
    temperature: float = key("MPPI elite weights exp(temperature * (V - V_max))")
    min_std: float = key("MPPI lower bound of the sampling std")
    max_std: float = key("MPPI initial sampling std and its upper bound")
    eval_deterministic: bool = key(
        "evaluate (and play) with the plan's action alone; false: with training's exploration noise added"
    )
    # -- optimisation ------------------------------------------------------------------------
    lr: float = key("Adam learning rate of world model and policy")
    enc_lr_scale: float = key("encoder learning rate = lr x enc_lr_scale")
    grad_clip_norm: float = key("gradient-norm clip of world model and policy (0: off)")
    rho: float = key("temporal weight rho^t of the losses over the horizon")
    consistency_coef: float = key("weight of the latent consistency loss")
    reward_coef: float = key("weight of the reward loss")
    value_coef: float = key("weight of the value (Q) loss")
    entropy_coef: float = key("weight of the policy's scaled entropy bonus")
    tau: float = key("soft-update rate of the target Q ensemble per optimizer step")
    discount: Optional[float] = key("discount (null: clip((L/5-1)/(L/5), 0.95, 0.995), L = episode length)")
    updates_per_step: int = key("updates (micro-batches) per local agent step once seeding is over")
    # -- data ----------------------------------------------------------------------------------
    seed_steps: Optional[int] = key(
        "global agent steps of random actions before learning (null: world_size x max(1000, 5 x episode_length))"
    )
    buffer_size: int = key("replay capacity per rank, in transitions")
    checkpoint_buffer: bool = key(
        "save each rank's replay buffer with every checkpoint "
        "(checkpoints/buffers/rank<r>.pt); resume then skips the refill"
    )
    episode_length: Optional[int] = key("agent steps per episode (null: the task's; DMC 500)")
    env_kwargs: dict[str, Any] = key("extra keyword arguments for the environment constructor")
    log_freq: int = key("log training metrics every this many global steps")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.model_size in (1, 5, 19, 48, 317), f"model_size={self.model_size} must be one of 1, 5, 19, 48, 317")
        for name in (
            "enc_dim",
            "mlp_dim",
            "latent_dim",
            "num_enc_layers",
            "num_q",
            "iterations",
            "seed_steps",
            "episode_length",
            "discount",
        ):
            value = getattr(self, name)
            _check(value is None or value > 0, f"{name}={value} must be > 0 or null")
        _check(
            self.latent_dim is None or self.latent_dim % 8 == 0,
            f"latent_dim={self.latent_dim} must be a multiple of 8 (SimNorm groups of 8)",
        )
        _check(self.num_q is None or self.num_q >= 2, f"num_q={self.num_q} must be >= 2 (TD targets use 2 members)")
        _check(0 <= self.dropout < 1, f"dropout={self.dropout} must be in [0, 1)")
        _check(self.horizon >= 1, f"horizon={self.horizon} must be >= 1")
        _check(
            0 < self.num_elites <= self.num_samples,
            f"num_elites={self.num_elites} must be in [1, num_samples={self.num_samples}]",
        )
        _check(
            0 <= self.num_pi_trajs < self.num_samples,
            f"num_pi_trajs={self.num_pi_trajs} must be in [0, num_samples={self.num_samples})",
        )
        _check(self.temperature > 0, f"temperature={self.temperature} must be > 0")
        _check(0 < self.min_std <= self.max_std, f"need 0 < min_std={self.min_std} <= max_std={self.max_std}")
        _check(self.lr > 0 and self.enc_lr_scale > 0, f"lr={self.lr} and enc_lr_scale={self.enc_lr_scale} must be > 0")
        _check(self.grad_clip_norm >= 0, f"grad_clip_norm={self.grad_clip_norm} must be >= 0")
        _check(0 < self.rho <= 1, f"rho={self.rho} must be in (0, 1]")
        for name in ("consistency_coef", "reward_coef", "value_coef", "entropy_coef"):
            _check(getattr(self, name) >= 0, f"{name}={getattr(self, name)} must be >= 0")
        _check(0 < self.tau <= 1, f"tau={self.tau} must be in (0, 1]")
        _check(self.discount is None or self.discount <= 1, f"discount={self.discount} must be in (0, 1] or null")
        _check(self.updates_per_step >= 1, f"updates_per_step={self.updates_per_step} must be >= 1")
        _check(self.buffer_size >= 2, f"buffer_size={self.buffer_size} must be >= 2")
        _check(self.log_freq >= 1, f"log_freq={self.log_freq} must be >= 1")
        _check(
            self.precision != "fp16",
            "precision=fp16 is not supported by tdmpc2 (no gradient scaler "
            "for its two optimizers); use precision=bf16 or fp32",
        )
        if self.episode_length is not None:
            _check(
                self.buffer_size > self.episode_length,
                f"buffer_size={self.buffer_size} must exceed episode_length={self.episode_length} "
                "(episodes are stored whole)",
            )

    def check(self) -> list[str]:
        """The task made once, as every rank makes it: a task TD-MPC2 cannot learn (discrete
        actions, image observations, no time limit) is refused before any rank starts, and a
        budget that ends before the first update is said."""
        warnings = super().check()
        import torch

        from ddprl.algos.tdmpc2.env import episode_length_of, make_tdmpc2_env

        env = make_tdmpc2_env(self, 1, seed=0, device=torch.device("cpu"))
        try:
            length = episode_length_of(self, env)
        finally:
            env.close()
        _check(self.buffer_size > length, f"buffer_size={self.buffer_size} must exceed the episode length {length}")
        seed_steps = self.seed_steps_for(length, self.world_size)
        if seed_steps >= self.steps:
            warnings.append(
                f"steps={self.steps} ends before the first update: the first seed_steps={seed_steps} "
                "global steps act randomly to fill the replay buffers (raise steps or lower seed_steps)"
            )
        return warnings

    def seed_steps_for(self, episode_length: int, world_size: int) -> int:
        """Global steps of random actions before learning: ``seed_steps``, else the paper's
        max(1000, 5 L) on every rank."""
        return self.seed_steps if self.seed_steps is not None else world_size * max(1000, 5 * episode_length)
