"""JaxMARL's own QMIX on SMAX (``baselines/QLearning/qmix_rnn.py``'s ``make_train``, imported unchanged from a
checkout) under JaxMARL's python, never importing ddprl: ``jaxmarl_qmix.py --jaxmarl DIR --overrides JSON --seed K
--out OUT``. The config is the script's Hydra one (``config.yaml`` with ``+alg=ql_rnn_smax``) with ``--overrides`` on
top and one seed, ``SEED=K``, as the script runs it. The script reports through ``wandb.log`` only; here that call
writes ``OUT/metrics.jsonl`` instead: one row per greedy test, ``eval/won_mean`` and ``eval/return_mean`` (ddprl's
names) at ``step`` env steps. ``OUT/result.json``: the config, commit, versions and seconds."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from purejaxrl_ppo import provenance  # this folder: sys.path[0] when run as a script

PACKAGES = ("jax", "jaxlib", "jaxmarl", "flax", "optax", "flashbax", "chex", "numpy")


def config_of(checkout: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """``python qmix_rnn.py +alg=ql_rnn_smax KEY=VALUE ...``'s config, merged as its ``single_run`` merges it."""
    from omegaconf import OmegaConf

    folder = checkout / "baselines" / "QLearning" / "config"
    config = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))
    config = {**config, **OmegaConf.to_container(OmegaConf.load(folder / "alg" / "ql_rnn_smax.yaml"))}
    return {**config, **overrides}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind in (("--jaxmarl", Path), ("--overrides", json.loads), ("--seed", int), ("--out", Path)):
        parser.add_argument(flag, type=kind, required=True)
    args = parser.parse_args()
    checkout = args.jaxmarl.resolve()
    config = {**config_of(checkout, args.overrides), "SEED": args.seed, "NUM_SEEDS": 1}
    config["WANDB_MODE"] = "offline"  # traces the script's report callback; wandb.log below, never wandb.init

    sys.path.insert(0, str(checkout / "baselines" / "QLearning"))
    import jax
    import qmix_rnn

    updates = int(config["TOTAL_TIMESTEPS"]) // config["NUM_STEPS"] // config["NUM_ENVS"]
    per_test = int(updates * config["TEST_INTERVAL"])  # the script's test condition
    rows: list[dict[str, float]] = []

    def log(metrics: dict[str, Any]) -> None:  # the script's wandb.log(metrics), once per update
        if int(metrics["update_steps"]) % per_test == 0:  # a fresh greedy test ran in this update
            row = {"step": int(metrics["env_step"]), "eval/won_mean": float(metrics["test_returned_won_episode"])}
            rows.append({**row, "eval/return_mean": float(metrics["test_returned_episode_returns"])})

    qmix_rnn.wandb.log = log
    env, _ = qmix_rnn.env_from_config(dict(config, ENV_KWARGS=dict(config["ENV_KWARGS"])))
    rngs = jax.random.split(jax.random.PRNGKey(config["SEED"]), 1)  # the script's split, for one seed
    start = time.perf_counter()
    jax.block_until_ready(jax.jit(jax.vmap(qmix_rnn.make_train(config, env)))(rngs))
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    commit, versions, python = provenance(checkout, PACKAGES)
    result = dict(seconds=round(seconds, 1), config=config, jaxmarl_commit=commit, versions=versions, python=python)
    (args.out / "result.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"jaxmarl qmix seed {args.seed}: {seconds:.0f} s (compile included)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
