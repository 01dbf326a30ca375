"""PPO steps/s beside Stable-Baselines3, CleanRL and PufferLib, one core each (``taskset -c CORE``,
OMP_NUM_THREADS=1, MKL_NUM_THREADS=1, torch threads 1), the two programs of a pair alternated, ``--repeats`` runs
each (median kept); ddprl runs the peer's hyperparameters as ddprl keys:

- ``cartpole-sb3``: SB3's ``PPO("MlpPolicy", "CartPole-v1")`` with its defaults (SB3_DRIVER: 1 env, n_steps 2048,
  batch 64, 10 epochs, lr 3e-4 constant, [64, 64] tanh, separate policy and value networks, orthogonal init) vs
  SB3_KEYS (vf_coef doubled: ddprl's value loss is half SB3's; advantages normalised per minibatch; no value
  clipping, no lr annealing);
- ``cartpole-cleanrl``: CleanRL's ``cleanrl/ppo.py`` unchanged with its defaults (4 envs x 128 steps, 4
  minibatches, 4 epochs, lr 2.5e-4 annealed, ent_coef 0.01, clipped value loss) vs CLEANRL_KEYS;
- ``halfcheetah-sb3``: SB3's defaults on HalfCheetah-v5 (SB3's gymnasium is 1.x) vs SB3_KEYS on HalfCheetah-v5;
- ``halfcheetah-cleanrl``: CleanRL's ``cleanrl/ppo_continuous_action.py`` unchanged (1 env x 2048 steps, 32
  minibatches, 10 epochs, lr 3e-4 annealed, observation and reward normalisation) on HalfCheetah-v4 (its pinned
  gymnasium 0.29.1, mujoco 2.3.3) vs CLEANRL_CONTINUOUS_KEYS on HalfCheetah-v4 (ddprl's gymnasium 1.x and mujoco);
- ``cartpole-pufferlib``: PufferLib's trainer (PuffeRL, from pufferlib-core: PUFFERLIB says why not ``pufferlib``)
  with CleanRL ppo.py's settings and network (PUFFER_DRIVER) vs CLEANRL_KEYS.

Measured alike: env steps from the end of the first iteration (a warm-up) to the end of the last over the time
between. ddprl: its metrics rows (one an iteration: step, wall_time), beside its own median ``time/global_fps``;
SB3: (timesteps, time) as each rollout starts (the previous update done) and after ``learn``, beside SB3's
``time/fps`` at the end; CleanRL: the time its ``SPS:`` line of each iteration is read, beside its last ``SPS``;
PufferLib: (global_step, time) after each evaluate + train, beside its steps over its uptime. Each run also
records the share of its core it got and what other processes used of that core and of the machine.

    python benchmarks/throughput.py [--repeats 3] [--steps 40960] [--only cartpole-sb3,cartpole-cleanrl,...]
        [--keys compile=true] [--core 0] [--sb3-python /work/sb3-venv/bin/python] [--cleanrl /work/cleanrl-checkout]
        [--cleanrl-python /work/cleanrl-venv/bin/python] [--pufferlib-python /work/puffer-venv/bin/python]

The peers' environments (Python 3.11; torch 2.13.0 from PyPI is the CPU build on this machine; pufferlib-core
pins torch 2.9.0):
    python3.11 -m venv /work/sb3-venv && /work/sb3-venv/bin/pip install torch==2.13.0 stable-baselines3 \\
        'gymnasium[mujoco]' mujoco==3.17.0
    python3.11 -m venv /work/cleanrl-venv && /work/cleanrl-venv/bin/pip install torch==2.13.0 \\
        'gymnasium==0.29.1' 'mujoco==2.3.3' 'numpy<2' tyro tensorboard imageio
    git clone https://github.com/vwxyzjn/cleanrl /work/cleanrl-checkout && git -C /work/cleanrl-checkout checkout COMMIT
    python3.11 -m venv /work/puffer-venv && /work/puffer-venv/bin/pip install pufferlib-core
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import harness as h
from results.peers import check_checkout
from results.rows import CLEANRL_CLONE, CLEANRL_COMMIT

from ddprl.timesplit import PHASES, shares

SEED, WARMUP, FPS = 1, 1, "time/global_fps"
# SB3's PPO defaults (stable_baselines3/ppo/ppo.py, MlpPolicy) as ddprl keys. SB3's value loss is F.mse_loss,
# ddprl's 0.5 x the mean square (as CleanRL's): vf_coef 0.5 there is 1.0 here.
SB3_KEYS = (
    "num_envs=1 n_steps=2048 batch_size=64 epochs=10 lr=0.0003 anneal_lr=false gamma=0.99 gae_lambda=0.95 "
    "clip_coef=0.2 clip_vloss=false vf_coef=1.0 ent_coef=0.0 max_grad_norm=0.5 target_kl=null norm_adv=minibatch "
    "norm_obs=false norm_reward=false hidden_sizes=[64,64] activation=tanh log_std_init=0.0 ortho_init=true"
)
# CleanRL's cleanrl/ppo.py defaults (the same value loss: vf_coef as it is)
CLEANRL_KEYS = (
    "num_envs=4 n_steps=128 minibatches=4 epochs=4 lr=0.00025 anneal_lr=true gamma=0.99 gae_lambda=0.95 "
    "clip_coef=0.2 clip_vloss=true vf_coef=0.5 ent_coef=0.01 max_grad_norm=0.5 target_kl=null norm_adv=minibatch "
    "norm_obs=false norm_reward=false hidden_sizes=[64,64] activation=tanh ortho_init=true"
)
# CleanRL's cleanrl/ppo_continuous_action.py defaults (NormalizeObservation and NormalizeReward, clipped to +-10)
CLEANRL_CONTINUOUS_KEYS = (
    "num_envs=1 n_steps=2048 minibatches=32 epochs=10 lr=0.0003 anneal_lr=true gamma=0.99 gae_lambda=0.95 "
    "clip_coef=0.2 clip_vloss=true vf_coef=0.5 ent_coef=0.0 max_grad_norm=0.5 target_kl=null norm_adv=minibatch "
    "norm_obs=true norm_reward=true hidden_sizes=[64,64] activation=tanh log_std_init=0.0 ortho_init=true"
)


@dataclass(frozen=True)
class Pair:
    task: str  # ddprl's and the peer's
    peer: str  # sb3 | cleanrl | pufferlib
    keys: str  # ddprl's keys for the peer's hyperparameters
    iteration: int  # env steps an iteration (both programs)
    target: float  # the issue's: ddprl / peer >= target (0: none)
    script: str = ""  # CleanRL's script, or the driver a peer's python runs


PAIRS = {
    "cartpole-sb3": Pair("CartPole-v1", "sb3", SB3_KEYS, 2048, 3.0, "SB3_DRIVER"),
    "cartpole-cleanrl": Pair("CartPole-v1", "cleanrl", CLEANRL_KEYS, 4 * 128, 2.0, "cleanrl/ppo.py"),
    "halfcheetah-sb3": Pair("HalfCheetah-v5", "sb3", SB3_KEYS, 2048, 2.0, "SB3_DRIVER"),
    "halfcheetah-cleanrl": Pair(
        "HalfCheetah-v4", "cleanrl", CLEANRL_CONTINUOUS_KEYS, 2048, 0.0, "cleanrl/ppo_continuous_action.py"
    ),
    "cartpole-pufferlib": Pair("CartPole-v1", "pufferlib", CLEANRL_KEYS, 4 * 128, 0.0, "PUFFER_DRIVER"),
}
PEERS = {"sb3": "Stable-Baselines3", "cleanrl": "CleanRL", "pufferlib": "PufferLib"}
PACKAGES = ("torch", "numpy", "gymnasium", "mujoco", "stable-baselines3", "tyro", "pufferlib-core")
# `pip install pufferlib` (3.0.0, a source package) did not install here; pufferlib-core, PufferLib's trainer
# (PuffeRL) and vector envs without its environments or configs, did, and runs PUFFER_DRIVER.
PUFFERLIB = (
    "PufferLib: `pip install pufferlib` (3.0.0) does not install here (its setup.py downloads raylib: "
    "urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>); the pufferlib pair runs "
    "pufferlib-core (PuffeRL, PufferLib's trainer) on Gymnasium's CartPole"
)

# Run by the SB3 environment's python: SB3's PPO with its defaults. One JSON line: (timesteps, time) at the end of
# each iteration (as the next rollout starts, and after learn) and SB3's own fps (its time/fps at the end).
SB3_DRIVER = """import json, sys, time
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

task, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)


class Ends(BaseCallback):
    def __init__(self):
        super().__init__()
        self.points = []

    def _on_rollout_start(self):  # the previous iteration's update is done
        if self.num_timesteps:
            self.points.append((self.num_timesteps, time.perf_counter()))

    def _on_step(self):
        return True


model = PPO("MlpPolicy", task, device="cpu", seed=seed, verbose=0)
ends = Ends()
model.learn(steps, callback=ends)
ends.points.append((model.num_timesteps, time.perf_counter()))
own = model.num_timesteps / ((time.time_ns() - model.start_time) / 1e9)
print(json.dumps({"points": ends.points, "own": own, "n_steps": model.n_steps, "batch_size": model.batch_size}))
"""

# Run by PufferLib's environment's python: PuffeRL on Gymnasium's CartPole with CleanRL ppo.py's settings (4 envs x
# 128 steps, 4 minibatches of 128 a epoch, 4 epochs, lr 2.5e-4 annealed (cosine: PufferLib's), ent 0.01, vf 0.5,
# value clip 0.2, Adam eps 1e-5) and its network ([64, 64] tanh, separate actor and critic, orthogonal init);
# uniform segment sampling (prio_alpha 0), V-trace clips 1. The loop is pufferl.train's, without its final evals.
PUFFER_DRIVER = """import json, sys, tempfile, time
import gymnasium, torch
import pufferlib.emulation, pufferlib.vector
from pufferlib import pufferl

task, steps, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)


def make(buf=None, seed=0):
    return pufferlib.emulation.GymnasiumPufferEnv(env=gymnasium.make(task), buf=buf, seed=seed)


def layer(n_in, n_out, std=2**0.5):
    linear = torch.nn.Linear(n_in, n_out)
    torch.nn.init.orthogonal_(linear.weight, std)
    torch.nn.init.zeros_(linear.bias)
    return linear


class Agent(torch.nn.Module):
    def __init__(self, env):
        super().__init__()
        n, a = env.single_observation_space.shape[0], env.single_action_space.n
        tanh = torch.nn.Tanh
        self.critic = torch.nn.Sequential(layer(n, 64), tanh(), layer(64, 64), tanh(), layer(64, 1, 1.0))
        self.actor = torch.nn.Sequential(layer(n, 64), tanh(), layer(64, 64), tanh(), layer(64, a, 0.01))

    def forward_eval(self, obs, state=None):
        return self.actor(obs), self.critic(obs)

    forward = forward_eval


vecenv = pufferlib.vector.make(make, backend=pufferlib.vector.Serial, num_envs=4, seed=seed)
config = dict(
    env=task, seed=seed, device="cpu", total_timesteps=steps, batch_size=512, bptt_horizon=128, minibatch_size=128,
    max_minibatch_size=128, update_epochs=4, learning_rate=2.5e-4, anneal_lr=True, gamma=0.99, gae_lambda=0.95,
    clip_coef=0.2, vf_coef=0.5, vf_clip_coef=0.2, ent_coef=0.01, max_grad_norm=0.5, optimizer="adam",
    adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-5, prio_alpha=0.0, prio_beta0=1.0, vtrace_rho_clip=1.0,
    vtrace_c_clip=1.0, precision="float32", compile=False, compile_mode="default", compile_fullgraph=False,
    cpu_offload=False, torch_deterministic=True, use_rnn=False, checkpoint_interval=10**9,
    data_dir=tempfile.mkdtemp(),
)
trainer = pufferl.PuffeRL(config, vecenv, Agent(vecenv.driver_env))
points = []
while trainer.global_step < steps:
    trainer.evaluate()
    trainer.train()
    points.append((trainer.global_step, time.perf_counter()))
own = trainer.global_step / trainer.uptime
trainer.close()  # stops its utilisation thread (the process waits for it), saves the model
print(json.dumps({"points": points, "own": own}))
"""


def ddprl_keys(pair: Pair, steps: int, extra=()) -> list[str]:
    """The keys of the ddprl run of ``pair``: the peer's hyperparameters, one rank on the CPU, nothing untimed; eager
    unless ``extra`` says compile=true (compile=auto would compile a long enough run: the table's rows say which)."""
    job = f"task={pair.task} world_size=1 device=cpu steps={steps} seed={SEED} compile=false"
    return [*job.split(), *pair.keys.split(), *h.QUIET, *extra]


def driver_result(lines: list[tuple[float, str]]) -> dict:
    """SB3_DRIVER's or PUFFER_DRIVER's JSON line."""
    return json.loads(next(text for _, text in reversed(lines) if text.startswith("{")))


def pinned(core: str, fn) -> dict:
    """``fn()`` (a :func:`harness.run` result) with the core's share the program got (its CPU-seconds over the
    wall time) and the others' load on that core (cores' worth)."""
    busy, mine, start = h.busy_seconds(f"cpu{core}"), os.times(), time.perf_counter()
    result = fn()
    wall, after = time.perf_counter() - start, os.times()
    cpu = (after.children_user + after.children_system) - (mine.children_user + mine.children_system)
    return {**result, "share": cpu / wall, "core_other": max(0.0, (h.busy_seconds(f"cpu{core}") - busy - cpu) / wall)}


def measured(run: dict, points: list[tuple[int, float]], own: float, command: str, **more) -> dict:
    """A run's record: its rate from ``points``, its own figure, the load beside it (machine and core)."""
    load = {k: run[k] for k in ("other", "share", "core_other")}
    return dict(rate=h.rate(points, WARMUP), own=own, command=command, **load, **more)


def run_ddprl(args, pair: Pair) -> dict:
    keys = ddprl_keys(pair, args.steps, args.keys)
    taskset = ["taskset", "-c", args.core]
    run = pinned(args.core, lambda: h.train(keys, prefix=taskset, env=h.ONE_THREAD, timeout=args.timeout))
    rows = [r for r in run["rows"] if FPS in r]  # one an iteration
    timed = rows[WARMUP:]
    split = {p: sum(r.get(f"time/{p}_s", 0.0) for r in timed) for p in PHASES}
    phases = {k: sum(r.get(f"time/{k}_s", 0.0) for r in timed) for k in ("rollout", "update")}
    points = [(r["step"], r["wall_time"]) for r in rows]
    command = f"OMP_NUM_THREADS=1 taskset -c {args.core} ddprl train " + " ".join(keys)
    own = h.median(h.column(timed, FPS))
    return measured(run, points, own, command, split=split, phases=phases)


def run_driver(args, pair: Pair) -> dict:
    """SB3 or PufferLib: ``pair.script`` (SB3_DRIVER, PUFFER_DRIVER) run from a file by the peer's python."""
    python, driver = getattr(args, f"{pair.peer}_python"), globals()[pair.script]
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch, "driver.py").write_text(driver)
        argv = ["taskset", "-c", args.core, python, "driver.py", pair.task, str(args.steps), str(SEED)]
        run = pinned(args.core, lambda: h.run(argv, env=h.ONE_THREAD, cwd=scratch, timeout=args.timeout))
    out = driver_result(run["lines"])
    command = f"OMP_NUM_THREADS=1 taskset -c {args.core} python {pair.script} {pair.task} {args.steps} {SEED}"
    return measured(run, out["points"], out["own"], command)


def cleanrl_flags(pair: Pair, steps: int) -> list[str]:
    flags = f"--env-id {pair.task} --total-timesteps {steps} --seed {SEED} --no-cuda --no-track --no-capture-video"
    return flags.split()


def run_cleanrl(args, pair: Pair) -> dict:
    flags = cleanrl_flags(pair, args.steps)
    argv = ["taskset", "-c", args.core, args.cleanrl_python, str(Path(args.cleanrl) / pair.script), *flags]
    with tempfile.TemporaryDirectory() as scratch:  # the script writes runs/ where it runs
        run = pinned(args.core, lambda: h.run(argv, env=h.ONE_THREAD, cwd=scratch, timeout=args.timeout))
    command = f"OMP_NUM_THREADS=1 taskset -c {args.core} python {pair.script} " + " ".join(flags)
    return measured(run, h.sps_points(run["lines"], pair.iteration), h.last_sps(run["lines"]), command)


def cells(results: list[dict], key: str, fmt: str = "{:,.0f}") -> str:
    ok = [r[key] for r in results if "error" not in r]
    return f"{fmt.format(h.median(ok))} ({', '.join(fmt.format(v) for v in ok)})" if ok else "failed"


def report_pair(name: str, pair: Pair, runs: dict[str, list[dict]], steps: int) -> dict:
    peer = PEERS[pair.peer]
    print(f"\n### {name}: {pair.task}, {steps:,} steps a run, iterations of {pair.iteration:,} (the first left out)\n")
    median = {prog: h.median([r["rate"] for r in rs if "error" not in r]) for prog, rs in runs.items()}
    ratio = median["ddprl"] / median[pair.peer]
    target = f">= {pair.target:g}x: {'met' if ratio >= pair.target else 'missed'}" if pair.target else "none"
    head = ["program", "steps/s: median (each repeat)", "ddprl / peer", "target", "own figure", "core share"]
    head += ["others on its core", "others, machine"]
    rows = []
    for prog, label in (("ddprl", "ddprl"), (pair.peer, f"{peer} `{pair.script}`")):
        rs, mine = runs[prog], prog == "ddprl"
        rows.append([label, cells(rs, "rate"), f"{ratio:.2f}x" if mine else "1", target if mine else ""])
        rows[-1] += [cells(rs, "own"), *(cells(rs, k, "{:.2f}") for k in ("share", "core_other", "other"))]
    h.table(head, rows)
    for prog, rs in runs.items():
        print(f"- {prog}: `{next((r['command'] for r in rs if 'command' in r), '')}`")
    ok = [r for r in runs["ddprl"] if "error" not in r]
    if ok:
        split = {p: h.median([r["split"][p] for r in ok]) for p in PHASES}
        parts = {k: h.median([r["phases"][k] for r in ok]) for k in ("rollout", "update")}
        each = ", ".join(f"{k} {v:.1f} s" for k, v in parts.items())
        print(f"- ddprl's time over the timed iterations (medians): {each}; {shares(split, at_least=0.02)}")
    return dict(pair=name, ratio=ratio, target=pair.target, median=median)


def main() -> None:
    doc = __doc__.replace("COMMIT", CLEANRL_COMMIT)
    p = h.parser(doc, repeats=3)
    p.add_argument("--steps", type=int, default=40_960, help="env steps a run (whole iterations of 2,048)")
    p.add_argument("--only", default=",".join(PAIRS), help=f"comma-separated pairs: {', '.join(PAIRS)}")
    p.add_argument("--keys", nargs="*", default=[], help="ddprl keys added to every ddprl run (compile=true)")
    p.add_argument("--core", default="0", help="the core every run is pinned to")
    p.add_argument("--sb3-python", default="/work/sb3-venv/bin/python", help="SB3's environment's python")
    p.add_argument("--cleanrl", default="/work/cleanrl-checkout", help="CleanRL's checkout at CLEANRL_COMMIT")
    p.add_argument("--cleanrl-python", default="/work/cleanrl-venv/bin/python", help="its environment's python")
    p.add_argument("--pufferlib-python", default="/work/puffer-venv/bin/python", help="PufferLib's environment's")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a run")
    args = p.parse_args()
    chosen = [name for name in PAIRS if name in args.only.split(",")]
    if not chosen:
        raise SystemExit(f"--only {args.only}: among {', '.join(PAIRS)}")
    if any(args.steps % PAIRS[name].iteration or args.steps < 2 * PAIRS[name].iteration for name in chosen):
        raise SystemExit(f"--steps {args.steps}: whole iterations of 2,048, at least two")
    if "cartpole-pufferlib" in chosen and not Path(args.pufferlib_python).exists():
        print(f"{PUFFERLIB.split(');')[0]}): no pufferlib pair (--pufferlib-python {args.pufferlib_python})")
        chosen.remove("cartpole-pufferlib")
    peers = {PAIRS[name].peer for name in chosen}
    for peer in sorted(peers - {"cleanrl"}):
        if not Path(getattr(args, f"{peer}_python")).exists():
            raise SystemExit(f"{PEERS[peer]} runs with its own environment's python: --{peer}-python PATH; see --help")
    for name in chosen:
        if PAIRS[name].peer == "cleanrl":
            clone, python, script = CLEANRL_CLONE, args.cleanrl_python, PAIRS[name].script
            check_checkout("CleanRL", Path(args.cleanrl), CLEANRL_COMMIT, clone, python, "see --help", script)
    runners = {"sb3": run_driver, "cleanrl": run_cleanrl, "pufferlib": run_driver}
    start = time.strftime("%Y-%m-%d %H:%M")
    print(f"Machine: {h.machine()}; {start}; core {args.core} for every run; {args.repeats} repeat(s) (median)")
    print(f"CleanRL {CLEANRL_COMMIT[:8]}; --keys {' '.join(args.keys) or '(none)'}")
    summary = []
    for name in chosen:
        pair = PAIRS[name]

        def timed(program: str, r: int, pair=pair, name=name) -> dict:
            result = run_ddprl(args, pair) if program == "ddprl" else runners[program](args, pair)
            print(f"[{name}, {program}, round {r + 1}] {result['rate']:,.0f} steps/s", file=sys.stderr, flush=True)
            return result

        plan = {program: lambda r, program=program: timed(program, r) for program in ("ddprl", pair.peer)}
        runs = h.alternate(plan, args.repeats)  # the order swapped each round
        if any(all("error" in r for r in rs) for rs in runs.values()):
            print(f"\n### {name}: no rate (every run of a program failed)")
            continue
        summary.append(report_pair(name, pair, runs, args.steps))
    if "pufferlib" in peers:
        print(f"\n{PUFFERLIB}")
    print(f"\nddprl: {h.versions(sys.executable, PACKAGES)}")
    for peer in sorted(peers):
        print(f"{PEERS[peer]}: {h.versions(getattr(args, f'{peer}_python'), PACKAGES)}")
    print("\n| pair | ddprl steps/s | peer steps/s | ddprl / peer | target |")
    print("|---|---:|---:|---:|---|")
    for s in summary:
        target = f">= {s['target']:g}x: {'met' if s['ratio'] >= s['target'] else 'missed'}" if s["target"] else "none"
        peer = next(v for k, v in s["median"].items() if k != "ddprl")
        print(f"| {s['pair']} | {s['median']['ddprl']:,.0f} | {peer:,.0f} | {s['ratio']:.2f}x | {target} |")


if __name__ == "__main__":
    main()
