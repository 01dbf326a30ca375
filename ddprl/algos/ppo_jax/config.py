"""Keys of PPO on the JAX engine: the torch PPO's keys (same meaning) plus ``devices``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ddprl.algos.ppo.config import PPOConfig
from ddprl.config.schema import _check, key


@dataclass(kw_only=True)
class JaxPPOConfig(PPOConfig):
    devices: Any = key(
        "JAX devices per process: auto (all local devices) or a number (the first N)", "auto", type_name="int | auto"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        d = self.devices
        _check(
            d == "auto" or (isinstance(d, int) and not isinstance(d, bool) and d >= 1),
            f"devices={d!r} must be auto or an integer >= 1",
        )
        _check(self.policy == "mlp", f"policy={self.policy!r}: engine=jax has the mlp policy only")
        _check(self.precision in ("auto", "fp32"), f"precision={self.precision}: engine=jax trains in fp32 only")
        _check(not self.autoscale, "autoscale=true is a torch-engine option; give num_envs and n_steps")

    def resolved(self, world_size: int) -> JaxPPOConfig:
        # num_envs=null (one env per device) is made concrete inside the job, where devices are known.
        return dataclasses.replace(self, world_size=world_size)

    def check_task(self) -> None:
        from ddprl.jax.envs import check_task
        from ddprl.jax.runtime import require_jax

        require_jax()
        check_task(self.task)

    def check(self) -> list[str]:
        self.check_task()
        # batch_size vs the per-device rollout needs the device count: checked inside the job.
        return self.schedule_warnings()
