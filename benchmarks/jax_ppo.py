"""PPO on CartPole-v1, time to eval return --target: ddprl engine=jax (N host devices) and engine=torch (W ranks), seeds
rotated, one run at a time, stopped at the target. The same settings on every row (8 envs in all, n_steps 256, global
minibatch --batch, 10 epochs, --lr annealed to 0 over --steps unless --no-anneal). train s: rollout + update
(evaluation, start-up and the jax compile apart); loop s: with evaluations; end-to-end: from process start.
``--target inf`` runs the whole budget: steps/s over it and the final return.

    pip install -e ".[jax]"
    python benchmarks/jax_ppo.py [--seeds 3] [--steps 300000] [--devices 2] [--world-sizes 1 2] [--skip-jax]
        [--jax-extra num_envs=64 ...] [--ddprl-extra clip_vloss=false ...] [--lr 3e-4 --no-anneal] [--target inf]
"""

from __future__ import annotations

import math
import time

import harness as h

TASK, NUM_ENVS, N_STEPS, EPOCHS, EVAL_EPISODES, EVAL = "CartPole-v1", 8, 256, 10, 10, "eval/return_mean"
ITERATION = NUM_ENVS * N_STEPS


def run_row(args, kind: str, n: int, seed: int) -> dict:
    """One run, stopped at its first evaluation >= target: the numbers there (or over the whole run)."""
    keys = f"algo=ppo task={TASK} steps={args.steps} num_envs={NUM_ENVS} n_steps={N_STEPS} epochs={EPOCHS} "
    keys += f"batch_size={args.batch // n} lr={args.lr} anneal_lr={str(args.anneal).lower()} seed={seed} "
    keys += f"eval_freq={args.eval_freq} eval_episodes={EVAL_EPISODES} eval_deterministic=true checkpoint_freq=0 "
    keys += "progress=false " + (f"engine=jax devices={n}" if kind == "jax" else f"world_size={n}")
    keys = [*keys.split(), *args.ddprl_extra, *(args.jax_extra if kind == "jax" else [])]
    env = {**h.ONE_THREAD, "CUDA_VISIBLE_DEVICES": "", **(h.jax_cpu(n) if kind == "jax" else {})}
    reached = lambda rows: any(r.get(EVAL, -math.inf) >= args.target for r in rows)  # noqa: E731
    run = h.train(keys, env=env, timeout=args.timeout, stop=reached)
    train_s, compile_s, evals = 0.0, 0.0, [math.nan]
    for r in run["rows"]:  # each iteration's seconds (the jax engine's; the torch one's rollout and update)
        train_s += sum(r.get(f"time/{k}_s", 0) for k in ("iteration", "rollout", "update"))
        compile_s, evals = compile_s + r.get("time/compile_s", 0), evals + h.column([r], EVAL)
        out = dict(compile_s=compile_s, final=evals[-1], other=run["other"], fps=r["step"] / train_s)
        if evals[-1] >= args.target:
            e2e, say = run["stop_s"] or run["wall"], f"{r['step']:,} steps, {train_s:.2f} s"
            return {**out, "step": r["step"], "train_s": train_s, "loop_s": r["wall_time"], "e2e": e2e, "say": say}
    say = f"not reached, last eval {evals[-1]:.1f}"
    return {**out, **dict.fromkeys(("step", "train_s", "loop_s", "e2e"), math.inf), "say": say}


def main() -> None:
    p = h.parser(__doc__, contention=(0.3, 1))
    p.add_argument("--seeds", type=int, default=3, help="seeds per row (medians reported)")
    p.add_argument("--steps", type=int, default=300_000, help="step budget per run (global steps)")
    p.add_argument("--eval-freq", type=int, default=8192, help=f"steps between evaluations, a multiple of {ITERATION}")
    p.add_argument("--target", type=float, default=475.0, help="eval return to reach (inf: the whole budget)")
    p.add_argument("--batch", type=int, default=256, help="global minibatch (per rank/device: batch / N)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--no-anneal", dest="anneal", action="store_false", help="a constant lr")
    p.add_argument("--devices", type=int, nargs="*", default=[2], help="jax rows: host devices each")
    p.add_argument("--world-sizes", type=int, nargs="*", default=[1, 2], help="torch rows: ranks each")
    p.add_argument("--skip-jax", action="store_true")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--ddprl-extra", nargs="*", default=[], metavar="KEY=VALUE", help="keys for every row")
    p.add_argument("--jax-extra", nargs="*", default=[], metavar="KEY=VALUE", help="keys for the jax rows only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    args = p.parse_args()
    plan = {} if args.skip_jax else {f"ddprl jax, {n} device(s)": ("jax", n) for n in args.devices}
    plan |= {} if args.skip_torch else {f"ddprl torch, {n} rank(s)": ("torch", n) for n in args.world_sizes}
    seeds = range(1, args.seeds + 1)
    jobs = {name: lambda r, k=k, n=n: run_row(args, k, n, seeds[r]) for name, (k, n) in plan.items()}
    runs = h.alternate(jobs, args.seeds, max_other=args.max_other, retries=args.retries)
    print(f"### PPO on {TASK}: time to eval return {args.target:g}\n\n{h.machine()}; {time.strftime('%Y-%m-%d')}")
    extra = " ".join(args.ddprl_extra + args.jax_extra)
    print(f"lr {args.lr:g}{' annealed' if args.anneal else ''}, {args.steps:,} steps, seeds {list(seeds)} {extra}\n")
    rows, columns = [], dict(step=0, train_s=2, fps=0, loop_s=2, e2e=1, final=1, other=2)
    for name, (kind, _) in plan.items():
        ok = [r for r in runs[name] if "error" not in r]
        for label, plus in [("", ())] + [(", incl. compile", ("train_s", "loop_s"))] * (kind == "jax"):
            cells = [cell([r[k] + r["compile_s"] * (k in plus) for r in ok], d) for k, d in columns.items()]
            rows.append([name + label, f"{sum(math.isfinite(r['step']) for r in ok)}/{len(runs[name])}", *cells])
    head = ["row", "reached", "steps to target", "train s", "train steps/s", "loop s", "end-to-end s"]
    h.table([*head, "eval return there (last)", "other cores"], rows)


def cell(values: list[float], digits: int) -> str:
    """The median of ``values``, then each (n/r: the target not reached)."""
    text = lambda v: "n/r" if math.isinf(v) else f"{v:,.{digits}f}"  # noqa: E731
    return text(h.median(values)) + (f" ({' / '.join(map(text, values))})" if len(values) > 1 else "")


if __name__ == "__main__":
    main()
