"""PPO on CartPole-v1, time to eval return --target: ddprl engine=jax (N host devices) and engine=torch (W ranks)
against Stable-Baselines3, seeds rotated, one run at a time, stopped at the target. The same settings on every row
(8 envs in all, n_steps 256, global minibatch --batch, 10 epochs, --lr annealed to 0 over --steps unless --no-anneal).
train s: rollout + update (evaluation, start-up and the jax compile apart); loop s: with evaluations; end-to-end: from
process start. ``--target inf`` runs the whole budget: steps/s over it and the final return.

    pip install -e ".[jax,bench]"
    python benchmarks/jax_ppo.py [--seeds 3] [--steps 300000] [--devices 2] [--world-sizes 1 2] [--skip-jax]
        [--jax-extra num_envs=64 ...] [--ddprl-extra clip_vloss=false ...] [--lr 3e-4 --no-anneal] [--target inf]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import harness as h

TASK, NUM_ENVS, N_STEPS, EPOCHS, EVAL_EPISODES = "CartPole-v1", 8, 256, 10, 10
ITERATION = NUM_ENVS * N_STEPS


def sb3_worker(args) -> None:
    """SB3's PPO with ddprl's settings: ddprl-like rows at each evaluation (``time/train_s``: evaluation apart)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    n = math.ceil(args.steps / ITERATION)
    lr = (lambda left: args.lr * min(1.0, left + 1 / n)) if args.anneal else args.lr  # iteration i: lr (1 - i / n)
    env, eval_env = make_vec_env(TASK, n_envs=NUM_ENVS, seed=args.seed), make_vec_env(TASK, 10, seed=args.seed + 10**6)
    model = PPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=args.batch, n_epochs=EPOCHS, learning_rate=lr,
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, clip_range_vf=None, ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, seed=args.seed, device="cpu")  # fmt: skip

    class Evaluate(BaseCallback):  # at the start of the rollout after each iteration crossing a multiple of eval_freq
        def _on_training_start(self) -> None:
            self.t0, self.eval_s, self.out = time.perf_counter(), 0.0, open(args.sb3_worker, "a", buffering=1)

        def _on_rollout_start(self) -> None:
            step = self.model.num_timesteps
            if step and args.eval_freq and step // args.eval_freq > (step - ITERATION) // args.eval_freq:
                self.evaluate(step)

        def _on_step(self) -> bool:
            return True

        def evaluate(self, step: int) -> None:
            start = time.perf_counter()
            row = {"step": step, "time/train_s": start - self.t0 - self.eval_s}
            mean = evaluate_policy(self.model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)[0]
            self.eval_s += time.perf_counter() - start
            self.out.write(json.dumps({**row, "wall_time": time.perf_counter() - self.t0, "eval/return_mean": mean}))
            self.out.write("\n")

    model.learn(total_timesteps=n * ITERATION, callback=(callback := Evaluate()))
    callback.evaluate(model.num_timesteps)  # the end of the budget, as ddprl


def command(args, kind: str, n: int, seed: int, run_dir: Path) -> tuple[list[str], dict]:
    """A row's command line and its environment."""
    if kind == "sb3":
        cmd = [sys.executable, __file__, "--sb3-worker", str(run_dir / "metrics.jsonl"), "--seed", str(seed)]
        cmd += [f"--steps={args.steps}", f"--eval-freq={args.eval_freq}", f"--batch={args.batch}", f"--lr={args.lr}"]
        return cmd + ([] if args.anneal else ["--no-anneal"]), {}
    keys = f"algo=ppo task={TASK} steps={args.steps} num_envs={NUM_ENVS} n_steps={N_STEPS} epochs={EPOCHS} "
    keys += f"batch_size={args.batch // n} lr={args.lr} anneal_lr={str(args.anneal).lower()} seed={seed} "
    keys += f"eval_freq={args.eval_freq} eval_episodes={EVAL_EPISODES} eval_deterministic=true checkpoint_freq=0"
    keys += " progress=false"
    keys += f" engine=jax devices={n}" if kind == "jax" else f" world_size={n}"
    keys = [*keys.split(), *args.ddprl_extra, *(args.jax_extra if kind == "jax" else []), f"run_dir={run_dir}"]
    env = {**h.ONE_THREAD, "CUDA_VISIBLE_DEVICES": ""}
    jax = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}", "JAX_PLATFORMS": "cpu"}
    return [sys.executable, "-m", "ddprl", "train", *keys], {**env, **(jax if kind == "jax" else {})}


def run_row(args, kind: str, n: int, seed: int) -> dict:
    """One run, stopped at its first evaluation >= target: the numbers there (or over the whole run)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd, env = command(args, kind, n, seed, Path(tmp))
        reached = lambda rows: any(r.get("eval/return_mean", -math.inf) >= args.target for r in rows)  # noqa: E731
        run = h.run(cmd, env=env, timeout=args.timeout, metrics=Path(tmp) / "metrics.jsonl", stop=reached)
    train_s, compile_s, evals, inf = 0.0, 0.0, [math.nan], math.inf
    for r in run["rows"]:
        if kind == "sb3":
            train_s = r["time/train_s"]
        else:
            train_s += r.get("time/iteration_s", 0) + r.get("time/rollout_s", 0) + r.get("time/update_s", 0)
        compile_s, evals = compile_s + r.get("time/compile_s", 0), evals + h.column([r], "eval/return_mean")
        if evals[-1] >= args.target:
            say = f"{r['step']:,} steps, {train_s:.2f} s"
            e2e, fps = run["stop_s"] or run["wall"], r["step"] / train_s
            out = dict(step=r["step"], train_s=train_s, loop_s=r["wall_time"], e2e=e2e, fps=fps, say=say)
            return {**out, "compile_s": compile_s, "final": evals[-1], "other": run["other"]}
    fps, say = run["rows"][-1]["step"] / train_s, f"not reached, last eval {evals[-1]:.1f}"
    out = dict(step=inf, train_s=inf, loop_s=inf, e2e=inf, compile_s=compile_s, fps=fps, final=evals[-1], say=say)
    return {**out, "other": run["other"]}


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--seeds", type=int, default=3, help="seeds per row (medians reported)")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=300_000, help="step budget per run (global steps)")
    p.add_argument("--eval-freq", type=int, default=8192, help=f"steps between evaluations, a multiple of {ITERATION}")
    p.add_argument("--target", type=float, default=475.0, help="eval return to reach (inf: the whole budget)")
    p.add_argument("--batch", type=int, default=256, help="global minibatch (ddprl per rank/device: batch / N)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--no-anneal", dest="anneal", action="store_false", help="a constant lr")
    p.add_argument("--devices", type=int, nargs="*", default=[2], help="ddprl jax rows: host devices each")
    p.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2], help="ddprl torch rows: ranks each")
    for kind in ("jax", "torch", "sb3"):
        p.add_argument(f"--skip-{kind}", action="store_true")
    p.add_argument("--ddprl-extra", nargs="*", default=[], metavar="KEY=VALUE", help="keys for every ddprl row")
    p.add_argument("--jax-extra", nargs="*", default=[], metavar="KEY=VALUE", help="keys for the jax rows only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--max-other", type=float, default=0.3, help="a run while others used more cores is redone")
    p.add_argument("--retries", type=int, default=1, help="redos of a contended run (the least contended kept)")
    p.add_argument("--sb3-worker", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_worker:
        return sb3_worker(args)
    plan = {} if args.skip_jax else {f"ddprl jax, {n} device(s)": ("jax", n) for n in args.devices}
    plan |= {} if args.skip_torch else {f"ddprl torch, {n} rank(s)": ("torch", n) for n in args.world_sizes}
    plan |= {} if args.skip_sb3 else {"SB3 PPO": ("sb3", 1)}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = {name: lambda r, k=k, n=n: run_row(args, k, n, seeds[r]) for name, (k, n) in plan.items()}
    runs = h.alternate(jobs, args.seeds, max_other=args.max_other, retries=args.retries)

    def cell(name: str, key: str, digits: int = 2, plus: str = "") -> str:
        values = [r[key] + (r[plus] if plus else 0) for r in runs[name] if "error" not in r]
        text = lambda v: "n/r" if math.isinf(v) else f"{v:,.{digits}f}"  # noqa: E731
        return text(h.median(values)) + (f" ({' / '.join(map(text, values))})" if len(values) > 1 else "")

    def report() -> None:
        print(f"### PPO on {TASK}: time to eval return {args.target:g}\n\n{h.machine()}; {time.strftime('%Y-%m-%d')}")
        extra = " ".join(args.ddprl_extra + args.jax_extra)
        print(
            f"lr {args.lr:g}{' annealed' if args.anneal else ''}, {args.steps:,} steps, seeds {list(seeds)} {extra}\n"
        )
        sb3 = h.median(r["train_s"] for r in runs.get("SB3 PPO", []) if "error" not in r)
        rows, columns = [], dict(step=0, train_s=2, fps=0, loop_s=2, e2e=1, final=1, other=2)
        for name, (kind, _) in plan.items():
            for label, plus in [("", "")] + [(", incl. compile", "compile_s")] * (kind == "jax"):
                ok = [r for r in runs[name] if "error" not in r]
                cells = [cell(name, key, d, plus * (key in ("train_s", "loop_s"))) for key, d in columns.items()]
                train = h.median(r["train_s"] + (r[plus] if plus else 0) for r in ok)
                cells.insert(2, f"{sb3 / train:.1f}x" if math.isfinite(sb3 / train) else "-")
                rows.append([name + label, f"{sum(not math.isinf(r['step']) for r in ok)}/{len(runs[name])}", *cells])
        head = ["row", "reached", "steps to target", "train s", "SB3 / row (train s)", "train steps/s", "loop s"]
        h.table([*head, "end-to-end s", "eval return there (last)", "other cores"], rows)

    h.report(report, args.report)


if __name__ == "__main__":
    main()
