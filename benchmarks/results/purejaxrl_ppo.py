"""PureJaxRL's own PPO (``purejaxrl/ppo.py``'s ``make_train``), run here, its curve written as ddprl's.

Run by ``run.py`` with the python of a separate environment that has PureJaxRL's imports (flax,
distrax, gymnax, brax and navix for its ``wrappers.py``); it never imports ddprl or torch::

    PUREJAXRL_PYTHON benchmarks/results/purejaxrl_ppo.py --purejaxrl DIR --config JSON --seed K --out OUT

``DIR`` is a checkout of github.com/luchris429/purejaxrl (run.py's docstring has the commands);
its ``purejaxrl/ppo.py`` is imported as it is and ``make_train(config)`` called with ``config``.
Nothing of PureJaxRL is copied here. One adapter stands between it and the environment:
PureJaxRL was written for gymnax < 1.0, whose ``step`` returned ``(obs, state, reward, done,
info)``; gymnax 1.0 returns ``terminated`` and ``truncated`` apart. :class:`FiveTupleStep` hands
PureJaxRL ``done = terminated | truncated``, which is what gymnax < 1.0 called ``done`` (a time
limit ended an episode like a termination), so PureJaxRL runs on the gymnax ddprl uses. It also
leaves out the ``final_observation`` gymnax 1.0 adds to ``info``: gymnax < 1.0 had none and ppo.py
never reads it, but ppo.py returns every step's ``info`` from its compiled call, and a MinAtar
observation on each of 1e7 steps is 16 GB (Breakout) to 24 GB (SpaceInvaders, more than the 2-core
machine's memory): the adapter keeps PureJaxRL's output what it was on the gymnax it was written for.

Written under ``OUT``:

- ``metrics.jsonl``: per update ``{"step", "train/episode_return", "wall_time"}`` in ddprl's
  format. ``train/episode_return`` is the mean return of the training episodes that ended in
  that update (``returned_episode_returns`` where ``returned_episode``): what ddprl logs
  under that key. (PureJaxRL's own plots average ``returned_episode_returns`` over every step
  and env, which repeats each env's last finished episode until its next one ends.) An update
  in which no episode ended has no row. The whole training is one compiled call, which has no
  clock per update: ``wall_time`` is the call's time spread evenly over the updates (every
  update is the same program).
- ``result.json``: compile and training seconds (the first timed apart with
  ``jax.jit(train).lower(key).compile()``), the config, the commit and the package versions.
"""

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


def commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown (not a git checkout)"


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def curve_rows(metrics: dict[str, Any], steps_per_update: int, train_s: float) -> list[dict[str, float]]:
    """ddprl-format rows of the finished training episodes' mean return per update."""
    import numpy as np

    returns = np.asarray(metrics["returned_episode_returns"], np.float64)  # (updates, steps, envs)
    ended = np.asarray(metrics["returned_episode"], bool)
    updates = returns.shape[0]
    rows = []
    for i in range(updates):
        if ended[i].any():
            rows.append(
                {
                    "step": (i + 1) * steps_per_update,
                    "train/episode_return": float(returns[i][ended[i]].mean()),
                    "train/episodes": float(ended[i].sum()),
                    "wall_time": round(train_s * (i + 1) / updates, 4),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--purejaxrl", type=Path, required=True, help="checkout of luchris429/purejaxrl")
    parser.add_argument("--config", required=True, help="make_train's config, as JSON")
    parser.add_argument("--seed", type=int, required=True, help="jax.random.PRNGKey(seed)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = json.loads(args.config)

    import jax

    make_train = import_make_train(args.purejaxrl.resolve())
    train = make_train(dict(config))  # make_train adds NUM_UPDATES and MINIBATCH_SIZE to its dict
    key = jax.random.PRNGKey(args.seed)
    start = time.perf_counter()
    compiled = jax.jit(train).lower(key).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(key))
    train_s = time.perf_counter() - start

    metrics = jax.device_get({k: out["metrics"][k] for k in ("returned_episode_returns", "returned_episode")})
    steps_per_update = config["NUM_STEPS"] * config["NUM_ENVS"]
    rows = curve_rows(metrics, steps_per_update, train_s)
    if rows:
        rows[0]["time/compile_s"] = round(compile_s, 3)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    result = {
        "compile_s": round(compile_s, 3),
        "train_s": round(train_s, 3),
        "updates": int(metrics["returned_episode"].shape[0]),
        "steps": int(metrics["returned_episode"].shape[0]) * steps_per_update,
        "seed": args.seed,
        "config": config,
        "purejaxrl_commit": commit(args.purejaxrl.resolve()),
        "devices": [str(d) for d in jax.devices()],
        "versions": versions(),
        "python": sys.version.split()[0],
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"purejaxrl seed {args.seed}: compiled in {compile_s:.1f} s, trained in {train_s:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
