"""TD-MPC2 speed: ms per update, ms per MPPI act, agent steps/s, on one rank.

    python benchmarks/tdmpc2_speed.py                           # walker-run, sizes 1 and 5, every device here
    python benchmarks/tdmpc2_speed.py --sizes 5 --devices cuda --compile off on

Measures the pieces of one agent step of the training loop with the paper's settings
(batch 256, horizon 3, MPPI 512 samples x 6 iterations, 24 policy trajectories): one
``update`` (buffer sample + world-model and policy steps, in a process group of one) and one
``Acting`` call (encode + MPPI with warm start) on one env, and the env's own step.
``agent steps/s`` = 1000 / (update + act + env step) ms: what one rank sustains after
seeding, one update per agent step. ``compile on``: the update is one compiled region and
the act three (the MPPI iteration one graph, replayed; CUDA graphs on a GPU); ``compile
whole``: the same update, the act compiled as ONE graph with every MPPI iteration unrolled
(what the official code does; not a training option: slower to compile, fewer launches, to
compare on a GPU). Compile time is excluded (warm-up) and printed apart.

References (the official code, model_size 5; docs/references.md#speed-of-the-official-code):
2-core CPU, walker-run, no compile: 484 ms per update, 496 ms per act. One H100, torch 2.11,
walker-run: eager 35.8 ms per update, 36.7 ms per act; compiled (its reduce-overhead update and
plan) 10.8 and 2.77 ms, 61.0 agent steps/s. Those are other runs on another day: run the
official code beside this script for a same-hour ratio.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch

# (device, model_size, compile, task) -> official (ms/update, ms/act)
REFERENCE = {
    ("cpu", 5, "off", "walker-run"): (484.0, 496.0),
    ("cuda", 5, "off", "walker-run"): (35.8, 36.7),
    ("cuda", 5, "on", "walker-run"): (10.8, 2.77),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(rt, cfg, threads: int, updates: int, acts: int, result: dict, whole_act: bool = False) -> None:
    """Runs inside ``launch`` (world_size=1): fills ``result`` with timings in ms."""
    from ddprl.algos.tdmpc2.acting import Acting, EpisodeRecorder, make_tdmpc2_env
    from ddprl.algos.tdmpc2.buffer import EpisodeBuffer
    from ddprl.algos.tdmpc2.learner import build_learner, draw_noise, update

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    env = make_tdmpc2_env(cfg, 1, seed=0, device=rt.device)
    obs_dim, action_dim = env.single_observation_space.shape[0], env.single_action_space.shape[0]
    learner = build_learner(rt, cfg, obs_dim, action_dim)
    buffer = EpisodeBuffer(20_000, obs_dim, action_dim)
    recorder = EpisodeRecorder(1)
    obs = env.reset()
    recorder.start(obs)
    t0 = time.perf_counter()
    steps = 0
    while buffer.num_episodes < 2:  # two random episodes to sample from
        action = torch.rand(1, action_dim, device=rt.device) * 2 - 1
        nxt, reward, terminated, truncated, info = env.step(action)
        for ep in recorder.add(action, reward, terminated, terminated | truncated, info["final_obs"], nxt):
            buffer.add_episode(*ep)
        obs, steps = nxt, steps + 1
    env_ms = (time.perf_counter() - t0) / steps * 1000
    shared = torch.Generator(device=rt.device).manual_seed(0)

    def one_update():
        batch = buffer.sample(cfg.batch_size, cfg.horizon, device=rt.device)
        update(rt, learner, [batch], [draw_noise(shared, learner.model.num_q, rt.device)], cfg, 0.99)

    acting = Acting(learner.model, cfg, discount=0.99, compile=cfg.compile and not whole_act)
    if whole_act:  # the eager act (its pieces uncompiled) compiled as one region
        from ddprl.algos.graphs import compile_region

        acting.act_fn = compile_region(acting.act_fn, rt.device, name="tdmpc2 act whole")
    t0 = time.perf_counter()
    for _ in range(2):  # warm-up: compilation, allocator, first-call costs
        one_update()
        acting(obs)
    _sync(rt.device)
    result["warmup_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(updates):
        one_update()
    _sync(rt.device)
    result["update_ms"] = (time.perf_counter() - t0) / updates * 1000
    t0 = time.perf_counter()
    for _ in range(acts):
        action = acting(obs)
        acting.episode_ended(torch.zeros(1, dtype=torch.bool))
    _sync(rt.device)
    result["act_ms"] = (time.perf_counter() - t0) / acts * 1000
    result["env_ms"] = env_ms
    result["params"] = sum(p.numel() for p in learner.model.parameters())
    env.close()


def row_line(task: str, device: str, size: int, comp: str, r: dict, sps: float) -> str:
    """One configuration's row of the table, with the official code's numbers where known."""
    ref = REFERENCE.get((device, size, "on" if comp == "whole" else comp, task))
    ref_text = ""
    if ref:
        ref_sps = 1000 / (ref[0] + ref[1] + r["env_ms"])
        ref_text = f"{ref[0]:.1f} ms/update, {ref[1]:.2f} ms/act: x{sps / ref_sps:.2f} steps/s"
    return (
        f"{device:6} {size:>4} {r['params']:>9,} {comp:7} {r['update_ms']:>10.1f} {r['act_ms']:>8.1f} "
        f"{r['env_ms']:>7.2f} {sps:>8.2f} {r['warmup_s']:>9.1f}  {ref_text}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="walker-run")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    parser.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on", "whole"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--updates", type=int, default=20, help="timed updates per configuration")
    parser.add_argument("--acts", type=int, default=20, help="timed MPPI acts per configuration")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads on CPU")
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "disable")

    from ddprl.config import load_config
    from ddprl.runtime import launch

    rows = []
    for device in args.devices:
        for size in args.sizes:
            for comp in args.compile:
                cfg = load_config(
                    [
                        "algo=tdmpc2",
                        f"task={args.task}",
                        "world_size=1",
                        "num_envs=1",
                        f"device={device}",
                        f"model_size={size}",
                        f"compile={comp != 'off'}",
                        f"precision={args.precision}",
                        "progress=false",
                    ]
                )
                result: dict = {}
                launch(
                    functools.partial(
                        measure,
                        threads=args.threads,
                        updates=args.updates,
                        acts=args.acts,
                        result=result,
                        whole_act=comp == "whole",
                    ),
                    cfg,
                )
                steps_per_s = 1000 / (result["update_ms"] + result["act_ms"] + result["env_ms"])
                rows.append((device, size, comp, result, steps_per_s))
                # each row as it is measured too: a run cut by a time limit keeps what it measured
                print("done:", row_line(args.task, device, size, comp, result, steps_per_s), flush=True)

    threads = f"{args.threads} thread(s)" if "cpu" in args.devices else ""
    print(
        f"\nTD-MPC2 speed, {args.task}, batch 256, MPPI 512 samples x 6 iterations (8 when A >= 20), "
        f"{args.precision}, {threads}"
    )
    print(
        f"{'device':6} {'size':>4} {'params':>9} {'compile':7} {'ms/update':>10} {'ms/act':>8} {'ms/env':>7} "
        f"{'steps/s':>8} {'warm-up s':>9}  reference (official code)"
    )
    for row in rows:
        print(row_line(args.task, *row))


if __name__ == "__main__":
    main()
