"""PPO (Schulman et al. 2017) on N ranks: ``train`` is the loop, ``load_actor`` serves eval/play."""

from ddprl.algos.ppo.loop import ARCHITECTURE_KEYS, load_actor, train

__all__ = ["train", "load_actor", "ARCHITECTURE_KEYS"]
