"""ddprl: reinforcement learning with PyTorch DistributedDataParallel."""

__version__ = "0.1.0"
