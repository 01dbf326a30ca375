"""QMIX's graph-reconstructer stages: samples/s of stage tokenizer and stage mask_predictor at 1 and 2 ranks (weak
scaling: node_batch_size per rank fixed, so 2 ranks take twice the samples a step), and what the frozen reconstructer
costs stage qmix per env step. One thread a process; --repeats rotate the rows, medians kept.

Samples/s: the last epoch's ``time/samples_per_s`` (optimizer steps x node_batch_size x ranks over the epoch's time,
validation apart). Reconstructer: vector steps/s of the battle's envs with and without it (both on this rank's
device), from a pretrained mask_predictor checkpoint (--checkpoint) or a fresh reconstructer of the default sizes.

    python benchmarks/qmix_stages.py [--task smax/3m] [--episodes 400] [--repeats 3] [--checkpoint PATH]
        [--stages tokenizer,mask_predictor]
"""

from __future__ import annotations

import harness as h

SIZES = ("epochs=2", "progress=false", "eval_episodes=0")


def stage_run(args, stage: str, world_size: int, init_from: str) -> dict:
    keys = [
        "algo=qmix",
        f"task={args.task}",
        f"stage={stage}",
        f"world_size={world_size}",
        f"pretrain_episodes={args.episodes * world_size}",  # the same share a rank
        *SIZES,
    ]
    if init_from:
        keys.append(f"init_from={init_from}")
    result = h.train(keys, env={"OMP_NUM_THREADS": "1"})
    result["samples_per_s"] = result["rows"][-1]["time/samples_per_s"]
    return result


def tokenizer_checkpoint(args, into) -> str:
    """A tokenizer trained briefly, for the mask predictor's runs (its speed does not depend on the codes' quality)."""
    import subprocess
    import sys

    run_dir = f"{into}/tokenizer"
    cmd = [sys.executable, "-m", "ddprl", "train", "algo=qmix", f"task={args.task}", "stage=tokenizer", "world_size=1"]
    cmd += [f"pretrain_episodes={args.episodes}", "epochs=1", "progress=false", f"run_dir={run_dir}"]
    subprocess.run(cmd, check=True, capture_output=True)
    return f"{run_dir}/checkpoints/best.pt"


def reconstructer_cost(args) -> tuple[float, float]:
    """Vector steps/s of ``num_envs`` battles, as they are and seen through the reconstructer."""
    import torch

    from ddprl.algos.qmix.graph_stages import MaskPredictorStage, StageContext, build_reconstructer
    from ddprl.algos.qmix.loop import seen_through
    from ddprl.checkpoint import load_checkpoint
    from ddprl.config import load_config
    from ddprl.envs.marl import make_marl_env

    torch.set_num_threads(1)
    plain = make_marl_env(args.task, args.num_envs, seed=0)
    if args.checkpoint:
        from ddprl.algos.qmix.graph_stages import reconstructer_state

        saved = reconstructer_state(load_checkpoint(args.checkpoint))
        reconstructer = build_reconstructer(saved, plain.node_layout, args.checkpoint)
    else:
        cfg = load_config(["algo=qmix", f"task={args.task}", "stage=mask_predictor"])
        layout = plain.node_layout
        modules = MaskPredictorStage().build(StageContext(layout, cfg, torch.zeros(3, layout.width)))
        reconstructer = MaskPredictorStage().reconstructer(modules, layout).eval()
    seen = seen_through(make_marl_env(args.task, args.num_envs, seed=0), reconstructer)
    rates = []
    for env in (plain, seen):
        obs = env.reset(seed=0)
        gen = torch.Generator().manual_seed(0)

        def step(env=env, holder=[obs], gen=gen):  # noqa: B006 (the latest observation, carried between calls)
            avail = holder[0].avail
            actions = torch.multinomial(avail.flatten(0, 1).float(), 1, generator=gen).view(avail.shape[:2])
            holder[0] = env.step(actions)[0]

        rates.append(h.calls_per_s(step, seconds=args.seconds, warmup=5))
    return rates[0], rates[1]


def main() -> None:
    import tempfile

    p = h.parser(__doc__, repeats=3)
    p.add_argument("--task", default="smax/3m")
    p.add_argument("--episodes", type=int, default=400, help="random episodes a rank plays")
    p.add_argument("--num-envs", type=int, default=8, help="battles a rank steps at once (stage qmix)")
    p.add_argument("--seconds", type=float, default=20.0, help="timing of each env row")
    p.add_argument("--checkpoint", default="", help="a stage=mask_predictor checkpoint for the reconstructer row")
    p.add_argument("--stages", default="tokenizer,mask_predictor", help="the stages whose samples/s are measured")
    args = p.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    print(f"{h.machine()}, {args.task}, {args.episodes} random episodes a rank, median of {args.repeats}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = tokenizer_checkpoint(args, tmp) if "mask_predictor" in stages else ""
        plan = {
            (stage, w): (lambda r, s=stage, w=w: stage_run(args, s, w, tokenizer if s == "mask_predictor" else ""))
            for stage in stages
            for w in (1, 2)
        }
        results = h.alternate(plan, args.repeats)
    h.table(["stage", "ranks", "samples/s", "weak-scaling efficiency"])
    for stage in stages:
        one = h.median(h.column(results[(stage, 1)], "samples_per_s"))
        for w in (1, 2):
            rate = h.median(h.column(results[(stage, w)], "samples_per_s"))
            h.row([stage, w, f"{rate:,.0f}", "-" if w == 1 else f"{rate / (w * one):.2f}"])
    plain, seen = reconstructer_cost(args)
    per_step_ms = 1000 / seen - 1000 / plain
    h.table(["envs", "vector steps/s", f"with the reconstructer (ms more a step of {args.num_envs} battles)"])
    h.row([args.num_envs, f"{plain:,.1f}", f"{seen:,.1f} (+{per_step_ms:.1f} ms)"])


if __name__ == "__main__":
    main()
