"""PPO on the JAX engine (``engine=jax``): the torch PPO's keys and semantics, compiled whole and
sharded over devices. ``loop.train`` is the loop, ``loop.load_actor`` serves eval/play.

Importing this module does not import JAX: only training, eval and play of an ``engine=jax``
job do.
"""

from pathlib import Path

from ddprl.algos.ppo_jax.config import JaxPPOConfig
from ddprl.registry import Algorithm

# The torch PPO's values: a job moves between engines with engine= alone.
_PPO_DEFAULTS = Path(__file__).parent.parent / "ppo" / "defaults.yaml"

ALGORITHM = Algorithm(
    name="ppo",
    engine="jax",
    config=JaxPPOConfig,
    train="ddprl.algos.ppo_jax.loop:train",
    load_actor="ddprl.algos.ppo_jax.loop:load_actor",
    defaults=_PPO_DEFAULTS,
    architecture_keys=("policy", "hidden_sizes", "activation"),
    description="PPO compiled whole in JAX: envs sharded over devices (gymnax, brax/MJX)",
)
