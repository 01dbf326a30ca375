"""TD-MPC2 (Hansen, Wang, Su, ICLR 2024) on N ranks: ``train`` is the loop, ``load_actor`` serves eval/play."""

from ddprl.algos.tdmpc2.loop import ARCHITECTURE_KEYS, load_actor, train

__all__ = ["train", "load_actor", "ARCHITECTURE_KEYS"]
