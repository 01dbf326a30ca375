"""PureJaxRL's own PPO (``purejaxrl/ppo.py``'s ``make_train``, imported unchanged from a checkout) under PureJaxRL's
python, never importing ddprl: ``purejaxrl_ppo.py --purejaxrl DIR --config JSON --seed K --out OUT``. Its one adapter
(:class:`FiveTupleStep`) hands it gymnax 1.0's ``terminated | truncated`` as gymnax < 1.0's ``done`` and drops
``final_observation`` (ppo.py would return it for every step: 16 to 24 GB on MinAtar). ``OUT/metrics.jsonl``: per
update, the mean return of the episodes that ended in it (``train/episode_return``, as ddprl logs); ``result.json``:
compile and training seconds (compiled apart, ``jax.jit(train).lower(key).compile()``), config, commit, versions."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PACKAGES = ("jax", "jaxlib", "gymnax", "flax", "distrax", "optax", "chex", "tfp-nightly", "brax", "navix", "numpy")


class FiveTupleStep:
    """A gymnax >= 1.0 env whose ``step`` returns gymnax < 1.0's five values and info (module docstring)."""

    def __init__(self, env: Any):
        self._env = env

    def __getattr__(self, name: str) -> Any:  # reset, spaces, default_params: the env's own
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        info = {k: v for k, v in info.items() if k != "final_observation"}  # module docstring
        return obs, state, reward, terminated | truncated, info


def import_make_train(checkout: Path) -> Any:
    """``make_train`` of ``checkout/purejaxrl/ppo.py``, its gymnax calls going through the adapter."""
    sys.path.insert(0, str(checkout / "purejaxrl"))  # ppo.py imports its sibling ``wrappers``
    import gymnax

    make = gymnax.make

    def make_five_tuple(name: str, **kwargs: Any) -> tuple[Any, Any]:
        env, params = make(name, **kwargs)
        return FiveTupleStep(env), params

    gymnax.make = make_five_tuple  # ppo.py calls gymnax.make inside make_train
    import ppo

    return ppo.make_train


def curve_rows(metrics: dict[str, Any], steps_per_update: int, train_s: float) -> list[dict[str, float]]:
    """ddprl-format rows of the finished training episodes' mean return per update."""
    import numpy as np

    returns = np.asarray(metrics["returned_episode_returns"], np.float64)  # (updates, steps, envs)
    ended, rows, n = np.asarray(metrics["returned_episode"], bool), [], len(returns)
    for i in (i for i in range(n) if ended[i].any()):
        row = {"step": (i + 1) * steps_per_update, "train/episode_return": float(returns[i][ended[i]].mean())}
        rows.append({**row, "train/episodes": float(ended[i].sum()), "wall_time": round(train_s * (i + 1) / n, 4)})
    return rows


def provenance(checkout: Path, packages: tuple[str, ...]) -> tuple[str, dict[str, str], str]:
    """A peer's run's origin, in the peer's own environment: its checkout's commit, the versions of ``packages``
    installed, and the Python version."""
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    found = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
    versions = {name: found[name] for name in packages if name in found}
    return head.stdout.strip() or "unknown", versions, sys.version.split()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind in (("--purejaxrl", Path), ("--config", json.loads), ("--seed", int), ("--out", Path)):
        parser.add_argument(flag, type=kind, required=True)
    args = parser.parse_args()
    config, checkout = args.config, args.purejaxrl.resolve()

    import jax

    train = import_make_train(checkout)(dict(config))  # make_train adds NUM_UPDATES and MINIBATCH_SIZE to its dict
    key, start = jax.random.PRNGKey(args.seed), time.perf_counter()
    compiled = jax.jit(train).lower(key).compile()
    compile_s, start = time.perf_counter() - start, time.perf_counter()
    out = jax.block_until_ready(compiled(key))
    train_s = time.perf_counter() - start

    metrics = jax.device_get({k: out["metrics"][k] for k in ("returned_episode_returns", "returned_episode")})
    steps_per_update = config["NUM_STEPS"] * config["NUM_ENVS"]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = curve_rows(metrics, steps_per_update, train_s)
    (args.out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    updates = int(metrics["returned_episode"].shape[0])
    commit, versions, python = provenance(checkout, PACKAGES)
    result = dict(compile_s=round(compile_s, 3), train_s=round(train_s, 3), updates=updates, seed=args.seed)
    result |= dict(steps=updates * steps_per_update, config=config, purejaxrl_commit=commit)
    result |= dict(devices=[str(d) for d in jax.devices()], versions=versions, python=python)
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"purejaxrl seed {args.seed}: compiled in {compile_s:.1f} s, trained in {train_s:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
