"""Typed configuration schemas: one dataclass per algorithm, one line of help per key.

Values live in the YAML files beside this module (``base.yaml``, ``algo/*.yaml``,
``task/*.yaml``); the schemas give types, help and range checks. Keys are flat on the command
line (``batch_size=256``), grouped here by concern. Global and local sizes are named apart:
``num_envs`` and ``steps`` are global (summed over ranks), ``batch_size`` is per rank, and
derived sizes (``local_num_envs``, ``effective_batch_size``) are properties, never inputs.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Optional

from ddprl.errors import UsageError


def key(help: str) -> Any:
    """A schema field with no default (its value comes from YAML) and its help line."""
    return field(default=MISSING, metadata={"help": help})


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


@dataclass
class CommonConfig:
    # -- job ---------------------------------------------------------------------------------
    algo: str = key("algorithm: ppo | tdmpc2")
    task: str = key("environment: a Gymnasium id (CartPole-v1, HalfCheetah-v5, ...)")
    seed: int = key("base seed; env i of rank r is seeded seed + r*10000 + i")
    steps: int = key("training budget in global agent steps (summed over ranks)")
    # -- distributed ------------------------------------------------------------------------
    world_size: int = key("number of processes in the job (spawn mode; torchrun/SLURM set it themselves)")
    nnodes: int = key("machines in a spawn-mode job (world_size is split evenly over them)")
    node_rank: int = key("index of this machine in a spawn-mode multi-node job")
    device: str = key("auto | cpu | cuda (rank -> cuda:LOCAL_RANK)")
    backend: str = key("auto | nccl | gloo (auto: NCCL when every rank owns a GPU)")
    master_addr: str = key("address of rank 0's machine")
    master_port: str = key("port of the rendezvous; auto picks a free one (single node)")
    dist_timeout: float = key("seconds before a stuck collective fails the job")
    sync_freq: int = key("all-reduce gradients every k updates (accumulate locally in between)")
    # -- sizes ------------------------------------------------------------------------------
    num_envs: int = key("environments in the whole job (split evenly over ranks)")
    batch_size: int = key("samples per update on each rank")
    # -- speed ------------------------------------------------------------------------------
    precision: str = key("fp32 | bf16 | fp16 (fp16 uses a gradient scaler)")
    compile: bool = key("torch.compile the networks")
    autoscale: bool = key("choose num_envs, n_steps and batch_size from the device's memory (keys you set win)")
    nccl_preset: str = key("none | nvlink | ib: NCCL variables for the interconnect (variables you exported win)")
    # -- evaluation, checkpoints, logs --------------------------------------------------------
    eval_freq: int = key("evaluate every this many global steps (0: only at the end)")
    eval_episodes: int = key("episodes per evaluation, split over ranks")
    checkpoint_freq: int = key("checkpoint every this many global steps (0: only at the end)")
    run_dir: str = key("run directory ('' -> runs/<algo>-<task>-<time>)")
    resume: str = key("'' | auto (latest.pt in run_dir) | path to a checkpoint")
    progress: bool = key("show a progress bar on rank 0")
    enable_wandb: bool = key("log to Weights & Biases too")
    wandb_project: str = key("W&B project")
    wandb_entity: str = key("W&B entity ('' for your default)")
    wandb_mode: str = key("online | offline (offline needs no network; sync later)")

    def __post_init__(self) -> None:
        _check(self.steps > 0, f"steps={self.steps} must be > 0")
        _check(self.world_size >= 1, f"world_size={self.world_size} must be >= 1")
        _check(self.sync_freq >= 1, f"sync_freq={self.sync_freq} must be >= 1")
        _check(self.num_envs >= 1, f"num_envs={self.num_envs} must be >= 1")
        _check(self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1")
        _check(self.dist_timeout > 0, f"dist_timeout={self.dist_timeout} must be > 0")
        _check(self.eval_freq >= 0, f"eval_freq={self.eval_freq} must be >= 0")
        _check(self.eval_episodes >= 0, f"eval_episodes={self.eval_episodes} must be >= 0")
        _check(self.checkpoint_freq >= 0, f"checkpoint_freq={self.checkpoint_freq} must be >= 0")
        _check(self.precision in ("fp32", "bf16", "fp16"), f"precision={self.precision!r} is not one of fp32, bf16, fp16")
        _check(self.device in ("auto", "cpu", "cuda"), f"device={self.device!r} is not one of auto, cpu, cuda")
        _check(self.backend in ("auto", "nccl", "gloo"), f"backend={self.backend!r} is not one of auto, nccl, gloo")
        _check(self.nccl_preset in ("none", "nvlink", "ib"), f"nccl_preset={self.nccl_preset!r} is not one of none, nvlink, ib")
        _check(self.wandb_mode in ("online", "offline"), f"wandb_mode={self.wandb_mode!r} is not online or offline")
        port = str(self.master_port)
        _check(port == "auto" or (port.isdigit() and 0 < int(port) < 65536),
               f"master_port={port!r} must be auto or a port number in 1..65535")
        if self.num_envs % self.world_size:
            raise UsageError(
                f"num_envs={self.num_envs} is not divisible by world_size={self.world_size}; "
                f"num_envs is global, use a multiple of {self.world_size}"
            )

    def check_sizes(self) -> None:
        """Checks across keys that training needs; algorithms add theirs."""

    def local_num_envs(self, world_size: int) -> int:
        """Environments on each rank (``num_envs`` is global)."""
        return self.num_envs // world_size

    def effective_batch_size(self, world_size: int) -> int:
        """Samples behind one optimizer step: batch_size x world_size x sync_freq (logged, never an input)."""
        return self.batch_size * world_size * self.sync_freq


@dataclass
class PPOConfig(CommonConfig):
    n_steps: int = key("rollout length per env between updates")
    epochs: int = key("passes over each rollout")
    lr: float = key("Adam learning rate")
    anneal_lr: bool = key("anneal the learning rate linearly to 0 over the budget")
    gamma: float = key("discount")
    gae_lambda: float = key("GAE lambda")
    clip_coef: float = key("PPO ratio clip")
    clip_vloss: bool = key("clip the value loss like the policy ratio")
    vf_coef: float = key("value-loss weight")
    ent_coef: float = key("entropy-bonus weight")
    max_grad_norm: float = key("gradient-norm clip (0: off)")
    target_kl: Optional[float] = key("stop the epoch loop when the globally reduced KL exceeds this (null: off)")
    norm_adv: bool = key("normalise advantages with the mean/std of all ranks' rollouts")
    norm_obs: bool = key("normalise observations with running statistics reduced over ranks")
    norm_reward: bool = key("divide rewards by the std of the discounted return (all ranks), clip to +-10")
    policy: str = key("mlp | cnn (cnn for image-like C x H x W observations)")
    hidden_sizes: list[int] = key("dense layer widths (of the MLPs; after the convs for cnn)")
    policy_width: int = key("CNN channels")
    policy_depth: int = key("CNN conv layers")
    env_kwargs: dict[str, Any] = key("extra keyword arguments for the environment constructor")
    eval_deterministic: bool = key("evaluate (and play) with the most likely action; false: sample from the policy")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.n_steps >= 1, f"n_steps={self.n_steps} must be >= 1")
        _check(self.epochs >= 1, f"epochs={self.epochs} must be >= 1")
        _check(self.lr > 0, f"lr={self.lr} must be > 0")
        _check(0 <= self.gamma <= 1, f"gamma={self.gamma} must be in [0, 1]")
        _check(0 <= self.gae_lambda <= 1, f"gae_lambda={self.gae_lambda} must be in [0, 1]")
        _check(self.clip_coef > 0, f"clip_coef={self.clip_coef} must be > 0")
        _check(self.max_grad_norm >= 0, f"max_grad_norm={self.max_grad_norm} must be >= 0")
        _check(self.target_kl is None or self.target_kl > 0, f"target_kl={self.target_kl} must be > 0 or null")
        _check(self.policy in ("mlp", "cnn"), f"policy={self.policy!r} is not mlp or cnn")

    def check_sizes(self) -> None:
        """Checks across keys that training needs (after autoscale; eval and play skip them)."""
        rollout = self.local_num_envs(self.world_size) * self.n_steps
        _check(self.batch_size <= rollout,
               f"batch_size={self.batch_size} is larger than the per-rank rollout "
               f"(num_envs/world_size x n_steps = {rollout})")


@dataclass
class TDMPC2Config(CommonConfig):
    # -- model (REFERENCE.md table; null dims come from model_size) --------------------------
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
    seed_steps: Optional[int] = key("global agent steps of random actions before learning "
                                    "(null: world_size x max(1000, 5 x episode_length))")
    buffer_size: int = key("replay capacity per rank, in transitions")
    checkpoint_buffer: bool = key("save each rank's replay buffer with every checkpoint "
                                  "(checkpoints/buffers/rank<r>.pt); resume then skips the refill")
    episode_length: Optional[int] = key("agent steps per episode (null: the task's; DMC 500)")
    env_kwargs: dict[str, Any] = key("extra keyword arguments for the environment constructor")
    log_freq: int = key("log training metrics every this many global steps")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.model_size in (1, 5, 19, 48, 317), f"model_size={self.model_size} must be one of 1, 5, 19, 48, 317")
        for name in ("enc_dim", "mlp_dim", "latent_dim", "num_enc_layers", "num_q", "iterations",
                     "seed_steps", "episode_length", "discount"):
            value = getattr(self, name)
            _check(value is None or value > 0, f"{name}={value} must be > 0 or null")
        _check(self.latent_dim is None or self.latent_dim % 8 == 0,
               f"latent_dim={self.latent_dim} must be a multiple of 8 (SimNorm groups of 8)")
        _check(self.num_q is None or self.num_q >= 2, f"num_q={self.num_q} must be >= 2 (TD targets use 2 members)")
        _check(0 <= self.dropout < 1, f"dropout={self.dropout} must be in [0, 1)")
        _check(self.horizon >= 1, f"horizon={self.horizon} must be >= 1")
        _check(0 < self.num_elites <= self.num_samples,
               f"num_elites={self.num_elites} must be in [1, num_samples={self.num_samples}]")
        _check(0 <= self.num_pi_trajs < self.num_samples,
               f"num_pi_trajs={self.num_pi_trajs} must be in [0, num_samples={self.num_samples})")
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
        _check(self.precision != "fp16", "precision=fp16 is not supported by tdmpc2 (no gradient scaler "
                                         "for its two optimizers); use precision=bf16 or fp32")
        if self.episode_length is not None:
            _check(self.buffer_size > self.episode_length,
                   f"buffer_size={self.buffer_size} must exceed episode_length={self.episode_length} "
                   "(episodes are stored whole)")


SCHEMAS: dict[str, type[CommonConfig]] = {"ppo": PPOConfig, "tdmpc2": TDMPC2Config}
