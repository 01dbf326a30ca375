"""PPO's keys (values: ``defaults.yaml`` beside this file). ``ddprl keys algo=ppo`` lists them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from ddprl.config.schema import RLConfig, _check, key


@dataclass(kw_only=True)
class PPOConfig(RLConfig):
    n_steps: int = key("rollout length per env between updates")
    minibatches: Optional[int] = key(
        "minibatches per epoch (CleanRL's num_minibatches): batch_size becomes each rank's rollout / this, "
        "so the global minibatch and the optimizer steps stay the same on any world_size (null: batch_size as given)"
    )
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
    norm_adv: Any = key(
        "normalise advantages: true with the mean/std of all ranks' whole rollouts; minibatch with those of "
        "each optimizer step's global minibatch (CleanRL, SB3, PureJaxRL); false: off",
        type_name="bool | minibatch",
    )
    norm_obs: bool = key("normalise observations with running statistics reduced over ranks")
    norm_reward: bool = key("divide rewards by the std of the discounted return (all ranks), clip to +-10")
    policy: str = key(
        "mlp | cnn (cnn for image-like C x H x W observations) | nature_cnn (Mnih et al. 2015's network for "
        "Atari frames: pixels / 255, fixed layers; the Atari preset's choice)"
    )
    hidden_sizes: list[int] = key("dense layer widths (of the MLPs; after the convs for cnn)")
    activation: str = key(
        "hidden-layer activation of policy=mlp: tanh (CleanRL, PureJaxRL's default) | relu (the cnn policy is relu)"
    )
    log_std_init: float = key("continuous actions: the policy's log std at the start (SB3's log_std_init)")
    ortho_init: bool = key(
        "orthogonal init (gain sqrt 2; 0.01 policy head, 1 value head; zero biases); false: the framework's "
        "default init of each layer (SB3's ortho_init=False)"
    )
    policy_width: int = key("CNN channels")
    policy_depth: int = key("CNN conv layers")
    env_kwargs: dict[str, Any] = key("extra keyword arguments for the environment constructor")
    env_backend: str = key(
        "Atari and MuJoCo tasks: auto (Atari: EnvPool where installed, else Gymnasium; MuJoCo: Gymnasium) "
        "| envpool | gymnasium",
        "auto",
    )
    eval_deterministic: bool = key("evaluate (and play) with the most likely action; false: sample from the policy")
    autoscale: bool = key("choose num_envs, n_steps and batch_size from the device's memory (keys you set win)")
    precision: str = key(
        "auto | fp32 | tf32 (fp32 with TF32 matrix products on CUDA) | bf16 (autocast, fp32 weights) | fp16 (with a "
        "gradient scaler); auto = bf16 for cnn and nature_cnn policies where every rank has bf16 units (a GPU of "
        "compute capability 8.0+, a CPU with AMX or AVX512_BF16), else fp32 (mlp policies: fp32, faster there)"
    )
    compile: Any = key(
        "auto | true | false: torch.compile the update whole and the policy's act (Snake: its rollout too; CUDA "
        "graphs on one GPU); auto = true on a CPU with a C++ compiler for runs of 50,000 optimizer steps or more, "
        "where the compile's 10-50 s pay back, else false",
        type_name="bool | auto",
    )
    env_overlap: Any = key(
        "auto | true | false: Atari on EnvPool: step half of a rank's games while the policy acts on the other "
        "half (two EnvPools, send/recv); auto = true where the rank has 2 or more cores of its own or acts on a GPU",
        type_name="bool | auto",
    )
    compile_unroll: int = key(
        "compile=true, on-device envs (snake): at most this many env steps per compiled rollout graph "
        "(a divisor of n_steps; more steps per graph: fewer launches, longer compile)"
    )

    PRECISIONS: ClassVar[tuple[str, ...]] = ("auto", *RLConfig.PRECISIONS)
    # batch_size and minibatches set one size two ways: the one from the later layer wins.
    ALTERNATIVES: ClassVar[tuple[tuple[str, str], ...]] = (("batch_size", "minibatches"),)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.n_steps >= 1, f"n_steps={self.n_steps} must be >= 1")
        _check(
            self.minibatches is None or self.minibatches >= 1, f"minibatches={self.minibatches} must be >= 1 or null"
        )
        _check(self.epochs >= 1, f"epochs={self.epochs} must be >= 1")
        _check(self.lr > 0, f"lr={self.lr} must be > 0")
        _check(0 <= self.gamma <= 1, f"gamma={self.gamma} must be in [0, 1]")
        _check(0 <= self.gae_lambda <= 1, f"gae_lambda={self.gae_lambda} must be in [0, 1]")
        _check(self.clip_coef > 0, f"clip_coef={self.clip_coef} must be > 0")
        _check(self.max_grad_norm >= 0, f"max_grad_norm={self.max_grad_norm} must be >= 0")
        _check(self.target_kl is None or self.target_kl > 0, f"target_kl={self.target_kl} must be > 0 or null")
        _check(
            isinstance(self.norm_adv, bool) or self.norm_adv == "minibatch",
            f"norm_adv={self.norm_adv!r} is not true, false or minibatch",
        )
        _check(self.policy in ("mlp", "cnn", "nature_cnn"), f"policy={self.policy!r} is not mlp, cnn or nature_cnn")
        _check(
            self.env_backend in ("auto", "envpool", "gymnasium"),
            f"env_backend={self.env_backend!r} is not auto, envpool or gymnasium",
        )
        _check(self.activation in ("tanh", "relu"), f"activation={self.activation!r} is not tanh or relu")
        _check(math.isfinite(self.log_std_init), f"log_std_init={self.log_std_init} must be a finite number")
        _check(
            all(isinstance(h, int) and h >= 1 for h in self.hidden_sizes),
            f"hidden_sizes={self.hidden_sizes} must be widths >= 1, e.g. [64, 64]",
        )
        _check(self.policy_width >= 1, f"policy_width={self.policy_width} must be >= 1")
        _check(self.policy_depth >= 1, f"policy_depth={self.policy_depth} must be >= 1")
        _check(self.compile_unroll >= 1, f"compile_unroll={self.compile_unroll} must be >= 1")
        _check(
            isinstance(self.compile, bool) or self.compile == "auto",
            f"compile={self.compile!r} is not auto, true or false",
        )
        _check(
            isinstance(self.env_overlap, bool) or self.env_overlap == "auto",
            f"env_overlap={self.env_overlap!r} is not auto, true or false",
        )

    def resolved(self, world_size: int) -> PPOConfig:
        cfg = super().resolved(world_size)
        return cfg.with_minibatches(cfg.local_num_envs(world_size) * cfg.n_steps)

    def with_minibatches(self, local_rollout: int) -> PPOConfig:
        """``batch_size`` derived from ``minibatches`` (when set): each rank's rollout of
        ``local_rollout`` samples in ``minibatches`` equal parts. With ``num_envs`` global the
        global minibatch is then the same on 1 or N ranks, as are the optimizer steps per epoch;
        a per-rank ``batch_size`` would make N times larger minibatches and N times fewer steps."""
        m = self.minibatches
        if m is None:
            return self
        _check(
            local_rollout % m == 0,
            f"minibatches={m} does not divide the rollout of each rank (or JAX device), {local_rollout} "
            f"samples: give a divisor of {local_rollout}, or batch_size instead",
        )
        return dataclasses.replace(
            self, batch_size=local_rollout // m, sources={**self.sources, "batch_size": "from minibatches"}
        )

    def check(self) -> list[str]:
        """Checks across keys that training needs (after autoscale; eval and play skip them)."""
        from ddprl.envs import check_task

        check_task(self.task, self.env_backend)  # RLConfig's check knows no back-end: what it lacks is named here
        warnings = super().check()
        rollout = self.local_num_envs(self.world_size) * self.n_steps
        if self.env_overlap is True:
            from ddprl.envs.atari import overlap_unsupported

            why = overlap_unsupported(self.task, self.env_backend, self.local_num_envs(self.world_size))
            _check(why is None, f"env_overlap=true: {why}; use env_overlap=auto or false")
        _check(
            self.batch_size <= rollout,
            f"batch_size={self.batch_size} is larger than the per-rank rollout "
            f"(num_envs/world_size x n_steps = {rollout})",
        )
        import gymnasium as gym

        from ddprl.envs import env_spaces
        from ddprl.envs.flatten import ENCODABLE, unencodable

        obs_space, action_space = env_spaces(self.task, backend=self.env_backend, **self.env_kwargs)
        _check(
            isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)),
            f"ppo acts in Discrete or Box action spaces; {self.task} has {action_space}",
        )
        # The env encodes what it can into a flat Box; any other space reaches this check as it is.
        bad = unencodable(obs_space)
        _check(
            bad is None,
            f"ppo observes {ENCODABLE}; {self.task} observes {obs_space}"
            + ("" if bad is obs_space else f", with a {type(bad).__name__} part"),
        )
        _check(
            # chosen in a layer of yours (a checkpoint only repeats the default it was saved with)
            self.policy == "mlp" or self.sources.get("activation", "default") in ("default", "checkpoint"),
            f"activation={self.activation} sets the mlp policy's activation; policy={self.policy} is relu throughout",
        )
        _check(
            self.policy == "mlp" or len(obs_space.shape or ()) == 3,
            f"policy={self.policy} needs C x H x W observations; {self.task} observes shape {obs_space.shape}: "
            "use policy=mlp",
        )
        sizes = ("hidden_sizes", "policy_width", "policy_depth")
        sized = [k for k in sizes if self.sources.get(k, "default") not in ("default", "checkpoint")]
        _check(
            self.policy != "nature_cnn" or not sized,
            f"{', '.join(sized)} size the mlp and cnn policies; policy=nature_cnn has the fixed layers of "
            "Mnih et al. 2015 (policy=cnn takes sizes)",
        )
        _check(
            self.policy != "nature_cnn" or min(obs_space.shape[1:]) >= 36,
            f"policy=nature_cnn needs frames of at least 36 x 36 pixels; {self.task} observes shape {obs_space.shape}",
        )
        return warnings
