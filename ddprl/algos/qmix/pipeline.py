"""``ddprl train algo=qmix stage=pipeline run_dir=DIR``: the three stages of QMIX with a graph
reconstructer in one command, each into its own run directory under ``DIR``:

    DIR/tokenizer        stage=tokenizer
    DIR/mask_predictor   stage=mask_predictor init_from=DIR/tokenizer/checkpoints/best.pt
    DIR/qmix             stage=qmix reconstruct=true init_from=DIR/mask_predictor/checkpoints/best.pt

Every other key given goes to every stage (a stage ignores the keys of the others). Each stage
runs with ``resume=auto``: the same command after a stop goes on where it stopped.
"""

from __future__ import annotations

from pathlib import Path

from ddprl.errors import UsageError

STAGES = (
    ("tokenizer", ()),
    ("mask_predictor", ("init_from={root}/tokenizer/checkpoints/best.pt",)),
    ("qmix", ("reconstruct=true", "init_from={root}/mask_predictor/checkpoints/best.pt")),
)
SET_PER_STAGE = ("resume", "init_from", "reconstruct", "full_obs")  # the pipeline gives each stage its own


def run_pipeline(overrides: list[str], config_name: str | None) -> int:
    """Run the stages one after another (every rank of each stage, then the next)."""
    from ddprl import registry
    from ddprl.prepare import prepare_train
    from ddprl.runlock import run_dir_held

    given = {item.split("=", 1)[0]: item for item in overrides if "=" in item}
    if given.get("algo", "algo=qmix") != "algo=qmix":
        raise UsageError("stage=pipeline is QMIX's: give algo=qmix")
    if "run_dir" not in given or not given["run_dir"].split("=", 1)[1]:
        raise UsageError("stage=pipeline writes one run directory per stage under run_dir: give run_dir=<a directory>")
    taken = sorted(k for k in given if k in SET_PER_STAGE)
    if taken:
        raise UsageError(f"stage=pipeline sets {', '.join(taken)} for each stage itself: leave them out")
    root = Path(given["run_dir"].split("=", 1)[1])
    common = [item for item in overrides if item.split("=", 1)[0] not in ("stage", "run_dir")]
    for stage, extra in STAGES:
        stage_keys = [f"stage={stage}", f"run_dir={root / stage}", "resume=auto", *(e.format(root=root) for e in extra)]
        cfg = prepare_train([*common, *stage_keys], config_name)
        algorithm = registry.get(cfg.algo, cfg.engine)
        with run_dir_held(cfg) as cfg:
            algorithm.launch_fn()(algorithm.train_fn(), cfg)
    return 0
