"""TD-MPC2 (Hansen, Wang, Su, ICLR 2024) on N ranks: ``loop.train`` is the loop, ``loop.load_actor``
serves eval/play."""

from pathlib import Path

from ddprl.algos.tdmpc2.config import TDMPC2Config
from ddprl.registry import Algorithm

ALGORITHM = Algorithm(
    name="tdmpc2",
    config=TDMPC2Config,
    train="ddprl.algos.tdmpc2.loop:train",
    load_actor="ddprl.algos.tdmpc2.loop:load_actor",
    defaults=Path(__file__).with_name("defaults.yaml"),
    architecture_keys=("model_size", "enc_dim", "mlp_dim", "latent_dim", "num_enc_layers", "num_q"),
    description="TD-MPC2: model-based RL with MPPI planning (DeepMind Control, Gymnasium)",
)
