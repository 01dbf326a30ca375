"""PPO (Schulman et al. 2017) on N ranks: ``loop.train`` is the loop, ``loop.load_actor`` serves eval/play."""

from pathlib import Path

from ddprl.algos.ppo.config import PPOConfig
from ddprl.registry import Algorithm

ALGORITHM = Algorithm(
    name="ppo",
    config=PPOConfig,
    train="ddprl.algos.ppo.loop:train",
    load_actor="ddprl.algos.ppo.loop:load_actor",
    defaults=Path(__file__).with_name("defaults.yaml"),
    architecture_keys=("policy", "hidden_sizes", "activation", "policy_width", "policy_depth"),
    prepare="ddprl.algos.ppo.autoscale:prepare",
    description="PPO with vectorised environments (Gymnasium, DMC, Snake on device)",
)
