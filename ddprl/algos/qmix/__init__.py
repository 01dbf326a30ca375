"""QMIX (Rashid et al. 2018) on N ranks for cooperative multi-agent tasks: ``loop.train`` is the
loop, ``loop.load_actor`` serves eval/play. VDN and independent Q-learning are ``mixer=vdn|none``."""

from pathlib import Path

from ddprl.algos.qmix.config import QMIXConfig
from ddprl.registry import Algorithm

ALGORITHM = Algorithm(
    name="qmix",
    config=QMIXConfig,
    train="ddprl.algos.qmix.loop:train",
    load_actor="ddprl.algos.qmix.loop:load_actor",
    defaults=Path(__file__).with_name("defaults.yaml"),
    architecture_keys=(
        "use_rnn",
        "hidden_dim",
        "obs_agent_id",
        "obs_last_action",
        "mixer",
        "mixing_embed_dim",
        "hypernet_layers",
        "hypernet_embed",
        "encoder_dim",
        "stage",
        "freeze_encoder",
        "reconstruct",
        "full_obs",
        "num_codes",
        "code_dim",
        "node_hidden",
        "d_model",
        "n_heads",
        "n_layers",
        "ffn_dim",
    ),
    description="QMIX / VDN value decomposition for cooperative multi-agent tasks (LBF, RWARE, MPE, VMAS)",
)
