"""TD-MPC2 on one rank: ms per update (batch 256, horizon 3), ms per MPPI act (512 samples x 6 iterations) and per env
step; agent steps/s = 1000 / their sum (one update a step). ``--compile on``: the training regions; ``whole``: the act
as ONE unrolled graph (as the official code; not a training option). Warm-up (compiling) apart. The official code's
figures: docs/references.md#speed-of-the-official-code.

    python benchmarks/tdmpc2_speed.py [--task walker-run] [--sizes 1 5] [--devices cpu cuda] [--compile off on whole]
"""

from __future__ import annotations

import functools
import itertools
import os
import time

import harness as h
import torch


def measure(rt, cfg, args, result: dict, whole_act: bool) -> None:
    """Inside ``launch`` (world_size=1): fills ``result`` with the timings (``whole_act``: ``--compile whole``)."""
    from ddprl.algos.tdmpc2.acting import Acting, EpisodeRecorder
    from ddprl.algos.tdmpc2.buffer import EpisodeBuffer
    from ddprl.algos.tdmpc2.env import make_tdmpc2_env
    from ddprl.algos.tdmpc2.learner import build_learner, draw_noise, update

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    env = make_tdmpc2_env(cfg, 1, seed=0, device=rt.device)
    obs_dim, action_dim = env.single_observation_space.shape[0], env.single_action_space.shape[0]
    learner, recorder = build_learner(rt, cfg, obs_dim, action_dim), EpisodeRecorder(1)
    buffer = EpisodeBuffer(20_000, obs_dim, action_dim)
    obs, steps, start = env.reset(), 0, time.perf_counter()
    recorder.start(obs)
    while buffer.num_episodes < 2:  # two random episodes to sample from
        action = torch.rand(1, action_dim, device=rt.device) * 2 - 1
        obs, reward, terminated, truncated, info = env.step(action)
        for episode in recorder.add(action, reward, terminated, terminated | truncated, info["final_obs"], obs):
            buffer.add_episode(*episode)
        steps += 1
    result["env_ms"] = (time.perf_counter() - start) / steps * 1000
    shared = torch.Generator(device=rt.device).manual_seed(0)

    def one_update():
        batch = buffer.sample(cfg.batch_size, cfg.horizon, device=rt.device)
        update(rt, learner, [batch], [draw_noise(shared, learner.model.num_q, rt.device)], cfg, 0.99)

    acting = Acting(learner.model, cfg, discount=0.99, compile=cfg.compile and not whole_act)
    if whole_act:  # the eager act compiled as one region
        from ddprl.algos.graphs import compile_region

        acting.act_fn = compile_region(acting.act_fn, rt.device, name="tdmpc2 act whole")

    def one_act():
        acting(obs)
        acting.episode_ended(torch.zeros(1, dtype=torch.bool))

    result["warmup_s"] = 2 / h.calls_per_s(lambda: (one_update(), acting(obs)), rt.device, calls=2)  # compiling
    ms = [1000 / h.calls_per_s(fn, rt.device, calls=n) for fn, n in ((one_update, args.updates), (one_act, args.acts))]
    result["update_ms"], result["act_ms"] = ms
    result["params"] = sum(p.numel() for p in learner.model.parameters())
    env.close()


def main() -> None:
    p = h.parser(__doc__)
    p.add_argument("--task", default="walker-run")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 5])
    p.add_argument("--devices", nargs="+", default=["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    p.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on", "whole"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--updates", type=int, default=20, help="timed updates per configuration")
    p.add_argument("--acts", type=int, default=20, help="timed MPPI acts per configuration")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads on CPU")
    args = p.parse_args()
    os.environ.setdefault("MUJOCO_GL", "disable")
    from ddprl.config import load_config
    from ddprl.runtime import launch

    threads = f", {args.threads} thread(s)" if "cpu" in args.devices else ""
    print(f"TD-MPC2 speed, {args.task}, batch 256, MPPI 512 x 6 (8 when A >= 20), {args.precision}{threads}")
    print(f"{h.machine()}\n")
    head = ["device", "size", "params", "compile", "ms / update", "ms / act", "ms / env", "steps/s", "warm-up s"]
    h.table(head)
    for device, size, comp in itertools.product(args.devices, args.sizes, args.compile):
        keys = f"algo=tdmpc2 task={args.task} world_size=1 num_envs=1 device={device} model_size={size} "
        keys += f"compile={comp != 'off'} precision={args.precision} progress=false"
        r = {}
        launch(functools.partial(measure, args=args, result=r, whole_act=comp == "whole"), load_config(keys.split()))
        sps = 1000 / (r["update_ms"] + r["act_ms"] + r["env_ms"])
        cells = [f"{r['update_ms']:.1f}", f"{r['act_ms']:.1f}", f"{r['env_ms']:.2f}", f"{sps:.2f}"]
        h.row([device, size, f"{r['params']:,}", comp, *cells, f"{r['warmup_s']:.1f}"])  # a time limit keeps it


if __name__ == "__main__":
    main()
