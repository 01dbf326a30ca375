"""Published results, reproduced: run one row of docs/results.md, or rebuild the page.

    python benchmarks/results/run.py ROW [--seeds 3]      # train each seed, keep its curve, summarise
    python benchmarks/results/run.py ROW --resume         # only the seeds the row's summary lacks
    python benchmarks/results/run.py --page               # docs/results.md and its PNGs from what is kept
    python benchmarks/results/run.py --list               # the rows and their commands
    python benchmarks/results/run.py QMIX_ROW --random    # random actions' return on its task (random.json)

Each seed trains with ``ddprl train`` (the row's keys, then ``seed=K``) in a scratch directory;
its ``metrics.jsonl`` (gzipped) and ``config.yaml`` are kept under ``benchmarks/results/runs/<row>/seed<K>/``
(small, committed, so anyone can re-plot), checkpoints and TensorBoard files are not.
``summary.json`` beside them holds what the page shows: per seed the evaluation return at the
reference's step count, the best and the final one, the wall time and the machine. The page is
built only from those files, so its numbers are the ones the runs printed. The summary is
rewritten after each seed: a row stopped part-way keeps the seeds it finished, and ``--resume``
trains the missing ones later (a row too long for one sitting). ``--jobs N`` trains N seeds at once.

Long rows (TD-MPC2: hours per seed) go further: each seed trains in ``benchmarks/results/work/<row>/seed<K>/``
(git-ignored), checkpointed with its replay buffer. SIGTERM or SIGUSR1 to this script passes on to
its runs, which save a checkpoint and exit 75 (so does the script), and each stopped seed's metrics
so far are kept in ``runs/<row>/in_progress/seed<K>/`` (committed: the page shows how far each seed
got, and draws it); the same command with ``--resume`` goes on from each seed's checkpoint, and a
finished seed is kept as any other (its in-progress copy removed)::

    python benchmarks/results/run.py tdmpc2-cartpole-swingup --seeds 3 --jobs 2 --resume   # again each sitting
    kill -TERM <its pid>                                                                    # at a sitting's end

(``--jobs 2`` on 2 cores: a seed to each core, the third when one ends. ``--jobs 3`` finishes the
row about as soon, but keeps no seed until near its end.) The work directory does not outlive its
machine: a sitting on a new one finds a seed's in-progress record and no checkpoint, moves the
record to ``runs/<row>/lost/seed<K>`` (kept and drawn: what that attempt measured) and starts the
seed again.

GPU rows (``tdmpc2-<task>-gpu``: ``device=cuda``) are long rows too, trained on a GPU machine by
``bash benchmarks/gpu_session.sh results`` (their missing seeds, in order, as far as its time goes);
the summary names the GPU with the machine.

Peer rows (``jax-cartpole``, ``jax-acrobot``) run another library here, on the same machine:
per seed, PureJaxRL's own PPO, then ddprl ``engine=jax`` on 1 and on 2 simulated CPU devices,
then ddprl ``engine=torch`` (2 ranks), all with the hyperparameters of PureJaxRL's ``ppo.py``. PureJaxRL
is not part of ddprl: it is imported from a checkout you make, and runs in an environment of
its own (flax, distrax, ...) through ``purejaxrl_ppo.py`` beside this file::

    git clone https://github.com/luchris429/purejaxrl purejaxrl
    git -C purejaxrl checkout 31756b197773a52db763fdbe6d635e4b46522a73
    python3.11 -m venv purejaxrl-venv
    purejaxrl-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 gymnax==1.0.1 flax==0.12.8 distrax==0.1.9 \
        tfp-nightly==0.26.0.dev20261027 optax==0.2.8 chex==0.1.92 brax==0.14.2 mujoco==3.17.0 \
        mujoco-mjx==3.17.0 navix==0.7.4
    python benchmarks/results/run.py jax-cartpole --purejaxrl purejaxrl \
        --purejaxrl-python purejaxrl-venv/bin/python [--seeds 3]
    python benchmarks/results/run.py jax-cartpole ... --seeds 1 --steps 20480 --runs /tmp/smoke   # a smoke run

Their runs are kept as ``runs/<row>/{purejaxrl,jax1,jax,torch}-seed<K>/`` (PureJaxRL's curve
converted to ddprl's ``metrics.jsonl``, so ``ddprl plot`` draws them all), and the page sets the
training-episode returns side by side with each run's wall time (compile and training apart).
``--runs DIR`` keeps runs, page and PNGs under DIR instead of the repository (smoke runs).

EPyMARL rows (``epymarl-lbf-8x8-2p-2f-coop``, ...) run EPyMARL's own QMIX here on the task of two
QMIX rows, on EPyMARL's protocol, and stand as those rows' reference (Papoudakis et al.'s table
is not transcribed). EPyMARL is not part of ddprl either: its unchanged ``src/main.py`` runs from
a tree you make, in an environment of its own (``EPYMARL_VENV`` in ``benchmarks/qmix_speed.py``),
through ``benchmarks/epymarl_probe.py``::

    python benchmarks/results/run.py epymarl-lbf-8x8-2p-2f-coop --epymarl /work/peers/epymarl \
        --epymarl-python /work/peers/epymarl-venv/bin/python --seeds 3 --jobs 2

Each seed's tests are kept as
``runs/<row>/seed<K>/`` like a ddprl run's evaluations; EPyMARL runs on one core, so ``--jobs N``
runs N seeds at once.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = HERE / "runs"
WORK = HERE / "work"  # long rows' runs in progress, between sittings (git-ignored): checkpoints, replay buffers
IN_PROGRESS = "in_progress"  # RUNS/<row>/in_progress/seed<K>: a long row's seed as its last sitting left it (kept)
LOST = "lost"  # RUNS/<row>/lost/seed<K>[-N]: a long row's seed whose checkpoint went with its machine: how far it got
SITTINGS = "sittings.json"  # a long row's run: the wall time of each sitting's `ddprl train` (start-up included)
PAGE = ROOT / "docs" / "results.md"
IMAGES = ROOT / "docs" / "results"
sys.path.insert(0, str(HERE.parent))  # benchmarks/machine.py


EVAL = "eval/return_mean"  # greedy actions, separate evaluation episodes
TRAIN = "train/episode_return"  # the training episodes' return: sampled actions, as CleanRL reports it


@dataclass(frozen=True)
class Reference:
    """A published number: ``value`` (± ``std`` when the source gives one) at ``steps``, measured
    as ddprl's ``metric`` is."""

    source: str  # who, where (paper table or repository file), what the std is over
    value: float
    std: float | None
    steps: int
    metric: str = EVAL


@dataclass(frozen=True)
class Row:
    title: str
    keys: tuple[str, ...]  # `ddprl train` keys; seed= and run_dir= are added per run
    references: tuple[Reference, ...]
    note: str = ""  # why ddprl differs from the reference, where it does by design
    digits: int = 1  # decimals of the page's numbers (LBF returns lie in [0, 1])
    papoudakis: bool = False  # also show Papoudakis et al.'s maximum and average returns (papoudakis_returns)
    agents: int = 1  # the page divides returns by this (MPE: per agent, as Papoudakis et al. report them)
    epymarl: str = ""  # the EPyMARL_ROWS row run here on the same task: a reference beside the published ones
    long: bool = False  # hours per seed: each seed trains in WORK and goes on from its checkpoint (train_and_keep)

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys)

    def key(self, name: str) -> str | None:
        """The value the row gives ``name`` (None where it leaves ddprl's default)."""
        return dict(key.split("=", 1) for key in self.keys).get(name)


METRIC_NAMES = {EVAL: "evaluation return", TRAIN: "training episodes' return"}
CLEANRL = (
    "CleanRL `docs/benchmark/ppo_continuous_action.md` (Open RL Benchmark tag pr-424, {task}-v4, "
    "1M steps; the training episodes' return at the end of training, ± over 3 seeds)"
)
ZOO = "SB3 zoo `benchmark.md` (rl-baselines3-zoo, one trained agent; ± over its evaluation episodes)"
LUNARLANDER_ZOO = (
    Reference(ZOO + " (LunarLander-v2: the same task before Gymnasium's fixes)", 242.119, 31.823, 1_000_000),
)
ROWS: dict[str, Row] = {
    "ppo-cartpole": Row(
        "PPO, CartPole-v1",
        ("task=CartPole-v1", "world_size=2", "steps=100000", "eval_freq=10000"),
        (Reference(ZOO, 500.0, 0.0, 100_000),),
    ),
    "ppo-acrobot": Row(
        "PPO, Acrobot-v1",
        ("task=Acrobot-v1", "world_size=2", "steps=1000000"),
        (Reference(ZOO, -73.506, 18.201, 1_000_000),),
    ),
    "ppo-pendulum": Row(
        "PPO, Pendulum-v1",
        ("task=Pendulum-v1", "world_size=2", "steps=200000", "eval_freq=10000"),
        (Reference(ZOO + ", with gSDE exploration", -172.225, 104.159, 100_000),),
        note="The zoo's agent explores with gSDE, which ddprl's PPO does not have; ddprl's preset "
        "normalises observations and rewards instead (docs/ppo.md, task presets).",
    ),
    "ppo-mountaincar": Row(
        "PPO, MountainCarContinuous-v0",
        ("task=MountainCarContinuous-v0", "world_size=2", "eval_freq=10000"),
        (Reference(ZOO + ", with gSDE exploration", 88.343, 2.572, 20_000),),
        note="The zoo's agent explores with gSDE and a small initial action noise; ddprl's preset keeps "
        "the default Gaussian (std 1) with the zoo's discount and normalisation.",
    ),
    "ppo-lunarlander": Row(
        "PPO, LunarLander-v3",
        ("task=LunarLander-v3", "world_size=2"),
        LUNARLANDER_ZOO,
        note="The preset gives the zoo's minibatch as minibatches=256 (of the 16 x 1024 rollout): batch_size "
        "64 on one rank, 32 on two, the zoo's minibatch of 64 and its optimizer steps on any world size. These "
        "runs were made as `ddprl train task=LunarLander-v3 world_size=2 batch_size=32` before the preset said "
        "minibatches: the same keys, which the command shown resolves to on 2 ranks (checked: 2 iterations of "
        "both commands with seed 1 gave the same metrics and bit-identical weights). Wall time: the test suite "
        "ran on the same 2 cores during these runs (not timed alone).",
    ),
    "ppo-lunarlander-batch64-per-rank": Row(
        "PPO, LunarLander-v3, minibatch 64 per rank",
        ("task=LunarLander-v3", "world_size=2", "batch_size=64"),
        LUNARLANDER_ZOO,
        note="The preset before it said minibatches: batch_size 64 per rank, so minibatches of 128 on 2 ranks "
        "and half the zoo's optimizer steps per epoch. These runs were made as `ddprl train task=LunarLander-v3 "
        "world_size=2` under that preset; the command shown runs the same keys today. This gap is why presets "
        "give minibatches (docs/ppo.md, task presets).",
    ),
    "ppo-halfcheetah": Row(
        "PPO, HalfCheetah-v5",
        ("task=HalfCheetah-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (
            Reference(CLEANRL.format(task="HalfCheetah"), 1442.64, 46.03, 1_000_000, TRAIN),
            Reference(ZOO + ", HalfCheetah-v3, tuned keys (not the paper's)", 5819.099, 663.530, 1_000_000),
        ),
        note="ddprl runs the paper's values, as CleanRL does; the zoo's agent has its own tuned keys "
        "(rl-baselines3-zoo hyperparams/ppo.yml: other network, learning rate, clipping and epochs), so its "
        "number is a reference for the task, not for these settings. The next row runs the zoo's keys.",
    ),
    "ppo-halfcheetah-zoo": Row(
        "PPO, HalfCheetah-v5, zoo keys",
        (
            "task=HalfCheetah-v5",
            "world_size=1",
            "num_envs=1",
            "n_steps=512",
            "batch_size=64",
            "epochs=20",
            "lr=2.0633e-05",
            "anneal_lr=false",
            "gamma=0.98",
            "gae_lambda=0.92",
            "clip_coef=0.1",
            "clip_vloss=false",
            "vf_coef=1.16192",
            "ent_coef=0.000401762",
            "max_grad_norm=0.8",
            "norm_obs=true",
            "norm_reward=true",
            "hidden_sizes=[256,256]",
            "activation=relu",
            "log_std_init=-2",
            "ortho_init=false",
        ),
        (Reference(ZOO + ", HalfCheetah-v3, the keys this row runs", 5819.099, 663.530, 1_000_000),),
        note="rl-baselines3-zoo hyperparams/ppo.yml's HalfCheetah-v3 entry as ddprl keys: one env on one rank, "
        "512 steps, minibatches of 64, 20 epochs, constant lr 2.0633e-05, clip 0.1 and no value clipping "
        "(clip_range_vf unset), separate 256-256 ReLU networks with PyTorch's own init and log std -2, "
        "observations and rewards normalised with gamma 0.98 (the zoo gives VecNormalize the algorithm's "
        "gamma). SB3's value loss is the squared error and ddprl's half of it, so vf_coef is twice the zoo's "
        "0.58096. What still differs: SB3 normalises advantages in each minibatch, ddprl over the rollout; "
        "the zoo's number is one trained agent's evaluation episodes on HalfCheetah-v3, ddprl's the mean "
        "over seeds on v5.",
    ),
    "ppo-hopper": Row(
        "PPO, Hopper-v5",
        ("task=Hopper-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (
            Reference(CLEANRL.format(task="Hopper"), 2382.86, 271.74, 1_000_000, TRAIN),
            Reference(ZOO + ", Hopper-v3, tuned keys", 2410.435, 10.026, 1_000_000),
        ),
    ),
    "ppo-walker2d": Row(
        "PPO, Walker2d-v5",
        ("task=Walker2d-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (
            Reference(CLEANRL.format(task="Walker2d"), 2287.95, 571.78, 1_000_000, TRAIN),
            Reference(ZOO + ", Walker2d-v3, tuned keys", 3478.798, 821.708, 1_000_000),
        ),
    ),
    "ppo-ant": Row(
        "PPO, Ant-v5",
        ("task=Ant-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (Reference(ZOO + ", Ant-v3, tuned keys", 1327.158, 451.577, 1_000_000),),
        "CleanRL's table (tag pr-424) has no Ant; the zoo's agent has its own tuned keys, so its number is a "
        "reference for the task, not for these settings (CleanRL's, as on the rows above). Ant-v5 pays the "
        "contact cost and observes the contact forces, as v3 did (v4 had dropped both by default).",
    ),
    "ppo-humanoid": Row(
        "PPO, Humanoid-v5",
        ("task=Humanoid-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (Reference(CLEANRL.format(task="Humanoid"), 716.11, 49.08, 1_000_000, TRAIN),),
        "CleanRL ran Humanoid-v4; v5 charges the contact cost that v4 had dropped and leaves out of the "
        "observation the parts that were always zero (Gymnasium's changelog for Humanoid-v5), so its returns run "
        "slightly lower for the same gait.",
    ),
}
# QMIX on EPyMARL's protocol (Papoudakis et al. 2021): 2M env steps (ddprl's QMIX defaults run
# 2.05M), 100 greedy test episodes every 50k, the team return. The paper's Table 3 gives each
# algorithm's "maximum returns": the evaluation step at which the mean over seeds is highest, and
# the mean and 95 % confidence interval over seeds at that step; and its "average returns", over
# all evaluations of training (papoudakis_returns computes both from the kept runs).
PAPOUDAKIS_NOTE = (
    "Reference: Papoudakis et al. 2021 (arXiv 2006.07869) Table 3, QMIX column, whose numbers are not "
    "transcribed here: no copy of the table was reachable from the machine these rows ran on (the stored "
    "copies of the paper hold its first page). 'ddprl best' is the paper's own measure, its maximum "
    "returns: the evaluation step where the mean over seeds is highest, the mean ± 95 % confidence "
    "interval over seeds there (the paper has 5 seeds). ddprl's QMIX defaults are EPyMARL's QMIX values "
    "except 8 environments in the job, standardised mixer states, time limits bootstrapped (not on MPE: "
    "its task preset) and 32 episodes per update on each rank (64 on these rows' 2 ranks) (docs/qmix.md)."
)
QMIX_TASKS = {  # row: (task, agents the page divides the team return by)
    "qmix-lbf-8x8-2p-2f-coop": ("Foraging-8x8-2p-2f-coop-v3", 1),
    "qmix-lbf-2s-8x8-2p-2f-coop": ("Foraging-2s-8x8-2p-2f-coop-v3", 1),
    "qmix-lbf-10x10-3p-3f": ("Foraging-10x10-3p-3f-v3", 1),
    "qmix-rware-tiny-2ag": ("rware-tiny-2ag-v2", 1),
    "qmix-mpe-simple-spread": ("simple_spread_v3", 3),
}
MPE_NOTE = (
    " The page shows simple_spread's return per agent, the team return (the sum of the 3 agents' rewards, "
    "what ddprl logs and the curve shows) divided by 3: Papoudakis et al.'s MPE returns are 'divided by the "
    "number of agents' (the authors' answer in github.com/uoe-agents/epymarl issue 29). Episodes of 25 steps "
    "(mpe2's default, EPyMARL's time_limit for MPE). mpe2's simple_spread_v3 gives each agent half its own "
    "collision penalty and half the shared distance term (local_ratio=0.5, its default); the paper's MPE "
    "version is not checked to weigh them alike, so its scale may differ. EPyMARL, run here, steps PettingZoo "
    "1.24.3's simple_spread_v3 (the game mpe2 took over) through its PettingZoo wrapper, which reports 0 for an "
    "episode's 25th step (PettingZoo has removed the agents by then and the wrapper fills in zeros): its returns "
    "miss one step of 25 (one episode of random actions: -63.15 through the wrapper, -65.09 from the game)."
)
# EPyMARL's QMIX settings on ddprl: its raw mixer states and unbootstrapped time limits, and its
# 32 episodes per update (16 on each of 2 ranks); ddprl's defaults differ in these only (and run
# 8 envs where EPyMARL's episode runner has one, which changes no update: one update per episode
# limit of env steps). On MPE ddprl's task preset already treats time limits as terminal.
EPYMARL_KEYS = ("batch_size=16", "standardise_state=false", "bootstrap_truncated=false")
EPYMARL_NOTE = (
    " This row: EPyMARL's QMIX settings (raw mixer states, time limits not bootstrapped, 32 episodes per "
    "update: 16 per rank); the row without 'EPyMARL's settings' runs ddprl's defaults."
)
# EPyMARL itself, run here on the QMIX rows' tasks: the reference that remains while Papoudakis et
# al.'s table is not transcribed. Its QMIX defaults (qmix_speed.SHARED writes out its config's
# values), its protocol (2.05M env steps, a greedy test of 100 episodes every 50k), the tests read
# from sacred's info.json and kept as ddprl metrics, so the page and `ddprl plot` read them as
# ddprl's runs. EPyMARL finds simple_spread in pettingzoo.mpe, which PettingZoo 1.26 moved out to the
# mpe2 package that ddprl steps: its environment has PettingZoo 1.24.3 (qmix_speed.EPYMARL_VENV).
QMIX_STEPS = 2_050_000
QMIX_EVAL_FREQ = 50_000
QMIX_EVAL_EPISODES = 100


def epymarl_row(qmix_row: str) -> str:
    return "epymarl-" + qmix_row.removeprefix("qmix-")


EPYMARL_ROWS = {epymarl_row(row): task for row, (task, _) in QMIX_TASKS.items()}
# What a task asks of the agents, where its returns need it to be read.
TASK_NOTES = {
    "qmix-lbf-10x10-3p-3f": (
        " Foraging-10x10-3p-3f-v3 (lbforaging 2.0) draws each food's level between 1 and the sum of the three "
        "players' levels (1 or 2 each): 58 % of the food needs two agents loading it together, 25 % all three. "
        "Random actions collect more than QMIX's greedy policy does here (the line 'random actions' above): "
        "ddprl's training episodes of its first 10k steps, epsilon from 1 down to 0.81, returned 0.11 to 0.13 "
        "(the three seeds of ddprl's defaults), then fell as epsilon fell (0.05 to 0.08 at 50k) and end at "
        "0.07 to 0.09 with epsilon 0.05. Within 2.05M steps QMIX, ddprl's and EPyMARL's alike, learns a "
        "policy that loads less food than chance does."
    ),
    "qmix-rware-tiny-2ag": (
        " rware-tiny-2ag-v2 (rware 2.0) pays an agent 1 for bringing a requested shelf to the goal and nothing "
        "else, in episodes of 500 steps: an episode of random actions seldom delivers once (the line 'random "
        "actions' above)."
    ),
}

# ddprl's defaults bootstrap time limits, except where a task preset says otherwise: on MPE,
# where the first run of this row diverged with them (kept as its own row).
BOOTSTRAP_NOTE = (
    " This row: ddprl's defaults but with time limits bootstrapped (bootstrap_truncated=true), QMIX's "
    "default on other tasks; ddprl's task preset for the cooperative MPE tasks treats them as terminal "
    "since this run: QMIX's mean Q grew from 24 at 110k steps to 15,000 at 1.2M and 375,000 at 2.05M, "
    "beyond any return the task can pay (a standardised reward of at most about 3 a step, 300 over the "
    "horizon of gamma 0.99), and its greedy return fell with it. The same job with VDN's mixer stayed "
    "bounded (mean Q 51 at 400k, the greedy return still rising), and with the time limit as terminal too "
    "(the row 'QMIX, simple_spread_v3'); docs/qmix.md has the measurements."
)
QMIX_VARIANTS = {  # row: its extra rows (suffix, title, keys, note) beyond the two every task has
    "qmix-mpe-simple-spread": (
        (
            "-bootstrap",
            "QMIX, simple_spread_v3, time limits bootstrapped",
            ("bootstrap_truncated=true",),
            BOOTSTRAP_NOTE,
        ),
    ),
}

for name, (task, agents) in QMIX_TASKS.items():
    for suffix, title, extra, note in (
        ("", f"QMIX, {task}", (), ""),
        ("-epymarl", f"QMIX, {task}, EPyMARL's settings", EPYMARL_KEYS, EPYMARL_NOTE),
        *QMIX_VARIANTS.get(name, ()),
    ):
        ROWS[name + suffix] = Row(
            title,
            ("algo=qmix", f"task={task}", "world_size=2", *extra),
            (),
            PAPOUDAKIS_NOTE + (MPE_NOTE if agents > 1 else "") + TASK_NOTES.get(name, "") + note,
            digits=2,
            papoudakis=True,
            agents=agents,
            epymarl=epymarl_row(name),
        )

# TD-MPC2 on DeepMind Control at 100k environment steps against the official per-task CSVs. DMC
# repeats each action twice, so 100k environment steps are 50k agent steps (ddprl's `steps`).
# model_size 1 (1M parameters; the CSVs' model has 5M): ~2.5 agent steps/s on one core of the
# 2-core CPU, some 6 h a seed, so a seed runs across sittings (Row.long). Evaluations: 4 episodes
# every 10k agent steps (the official code plays 10): on one core an MPPI act for 8 envs at once
# took 6.5x one env's (2.8 s against 0.44, the machine shared), so 8 episodes would add ~2 h a seed.
TDMPC2_CSV = (
    "official TD-MPC2 per-task CSV (github.com/nicklashansen/tdmpc2 `results/tdmpc2/{task}.csv`, the default "
    "5M-parameter model; mean ± std of its 3 seeds, {seeds}, at 100,000 environment steps = 50,000 agent steps)"
)
TDMPC2_TASKS = {  # the CSV's 3 seeds at 100k environment steps
    "cartpole-swingup": (789.8, 867.9, 860.5),
    "reacher-easy": (972.8, 977.9, 859.9),
    "finger-spin": (985.6, 937.3, 919.6),
}
TDMPC2_NOTE = (
    "ddprl runs model_size 1 (1M parameters) where the CSVs' runs have 5M: a 2-core CPU makes ~2.5 agent steps/s "
    "at model_size 1, half that at 5. Steps on the page and the curve are agent steps (action repeat 2). "
    "Evaluation: 4 episodes every 10,000 agent steps (the official code plays 10; each episode is 500 MPPI "
    "plans). A seed trains across sittings, checkpointed with its replay buffer every 2,500 agent steps; its "
    "wall time is the sum of its sittings' (each one's whole `ddprl train` command). The lost attempts of "
    "cartpole-swingup's seeds 1 and 2 began before sittings were timed so: their first four and three sittings' "
    "times are estimated from their logs' timestamps (to about a minute each)."
)
TDMPC2_GPU_NOTE = (
    "The CSVs' model (model_size 5, 5M parameters) on one GPU, compiled (`compile=true`), in fp32 (the "
    "official training script has turned TF32 on since September 2024; the CSVs were committed before "
    "that), one seed at a time: `bash benchmarks/gpu_session.sh results` trains the next seeds of these "
    "GPU rows in order, in device commands of 10 min at most; a seed stopped by a command's end goes on "
    "from its checkpoint when the phase runs again at once on the same machine, and starts afresh in a "
    "later session (its checkpoint goes with the machine). A GPU session's 15 min of device time trains "
    "about one seed. Evaluation: 10 episodes every 10,000 agent steps, as the official code plays. Steps "
    "are agent steps (action repeat 2)."
)
TDMPC2_GPU_RUNS = {  # how each task's GPU seeds went, where the row's note has more to say than its numbers
    "cartpole-swingup": (
        " Seed 1 (an H200) made 45,249 agent steps in its first command (about 9 min; it reached step 3,000 "
        "after 75 s, the compile and 2,500 pretraining updates included) and was stopped there with a "
        "checkpoint; a second command at once on the same machine resumed it and ended it (about 2 min, "
        "compiling again from warm caches): 11.0 min in all, 124 to 130 agent steps/s between evaluations (an "
        "H100 made 112 to 125 in the speed benchmark, docs/benchmarks.md). A later session trained seeds 2 "
        "and 3 side by side on one H200 (RESULTS_JOBS=2), 28,441 and 28,794 agent steps in 8.6 min (in all "
        "about 1.3 times the agent steps/s of one seed alone, two thirds of it each), stopped with "
        "checkpoints that went with the machine before the command that would have finished them: lost. "
        "Seed 2 was trained again alone in the next GPU session (2026-11-27, an H200) and finished within "
        "one command: 9.2 min, step 3,000 after 57 s, then 113 to 137 agent steps/s (median 133). Seed 3: "
        "not run yet."
    ),
}
TDMPC2_CPU_TASKS = ("cartpole-swingup",)  # what 2 cores carry: some 6 h a seed (reacher-easy, finger-spin: GPU rows)
for task, published in TDMPC2_TASKS.items():
    reference = Reference(
        TDMPC2_CSV.format(task=task, seeds=" / ".join(f"{v:g}" for v in published)),
        round(statistics.mean(published), 1),
        round(statistics.stdev(published), 1),
        50_000,
    )
    if task in TDMPC2_CPU_TASKS:
        ROWS[f"tdmpc2-{task}"] = Row(
            f"TD-MPC2, {task}, model_size 1 (agent steps: half the environment steps)",
            (
                "algo=tdmpc2",
                f"task={task}",
                "model_size=1",
                "world_size=1",
                "steps=50000",
                "eval_freq=10000",
                "eval_episodes=4",
                "checkpoint_freq=2500",
                "checkpoint_buffer=true",
            ),
            (reference,),
            TDMPC2_NOTE,
            long=True,
        )
    ROWS[f"tdmpc2-{task}-gpu"] = Row(
        f"TD-MPC2, {task}, model_size 5, one GPU (agent steps: half the environment steps)",
        (
            "algo=tdmpc2",
            f"task={task}",
            "model_size=5",
            "device=cuda",
            "compile=true",
            "world_size=1",
            "steps=50000",
            "eval_freq=10000",
            "eval_episodes=10",
            "checkpoint_freq=10000",
            "checkpoint_buffer=true",
        ),
        (reference,),
        TDMPC2_GPU_NOTE + TDMPC2_GPU_RUNS.get(task, ""),
        long=True,
    )


@dataclass(frozen=True)
class SupervisedRow:
    """ddprl's Trainer against baselines fitted on the same train split (train + val: ddprl picks
    its epoch on val), both scored on the same test split."""

    title: str
    keys: tuple[str, ...]
    dataset: str  # the task: a scikit-learn bundled set of ddprl.supervised.tasks, or graph_energy
    metric: str = "accuracy"  # the test metric compared (ddprl logs it as test/<metric>)

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys)

    def baselines(self, seed: int) -> dict[str, float]:
        return graph_baselines() if self.dataset == "graph_energy" else sklearn_baselines(self.dataset, seed)


SUPERVISED_ROWS: dict[str, SupervisedRow] = {
    "supervised-digits": SupervisedRow(
        "Supervised, digits (MLP 128-128)", ("algo=supervised", "task=digits", "world_size=2"), "digits"
    ),
    "supervised-breast-cancer": SupervisedRow(
        "Supervised, breast_cancer (MLP 128-128)",
        ("algo=supervised", "task=breast_cancer", "world_size=2"),
        "breast_cancer",
    ),
    "supervised-graph-energy": SupervisedRow(
        "Supervised, graph_energy (GNN, 2 layers of 64)",
        ("algo=supervised", "task=graph_energy", "world_size=2"),
        "graph_energy",
        metric="mse",
    ),
}
COMMON = ("progress=false", "checkpoint_freq=0", "keep_last=1")


# -- peer rows: ddprl's two engines beside PureJaxRL's PPO, all run here ------------------------------
PUREJAXRL_REPO = "https://github.com/luchris429/purejaxrl"
PUREJAXRL_COMMIT = "31756b197773a52db763fdbe6d635e4b46522a73"  # 2024-09-09, the newest when this was written
PUREJAXRL_CLONE = f"git clone {PUREJAXRL_REPO} purejaxrl && git -C purejaxrl checkout {PUREJAXRL_COMMIT}"
# The separate environment PureJaxRL runs in: its ppo.py imports flax, distrax and its own
# wrappers.py, which imports brax and navix. The same jax and gymnax as ddprl's jax extra.
PUREJAXRL_VENV = (
    "python3.11 -m venv purejaxrl-venv && purejaxrl-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 "
    "gymnax==1.0.1 flax==0.12.8 distrax==0.1.9 tfp-nightly==0.26.0.dev20261027 optax==0.2.8 chex==0.1.92 "
    "brax==0.14.2 mujoco==3.17.0 mujoco-mjx==3.17.0 navix==0.7.4"
)
# purejaxrl/ppo.py's own configuration (its __main__), ENV_NAME set per row. TOTAL_TIMESTEPS is
# its 5e5 written as an integer: the number of updates, 976, is the same.
PUREJAXRL_PPO = {
    "LR": 2.5e-4,
    "NUM_ENVS": 4,
    "NUM_STEPS": 128,
    "TOTAL_TIMESTEPS": 500_000,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ANNEAL_LR": True,
    "DEBUG": False,  # its __main__ says True: a host callback printing every episode, not timed here
}
# The configuration of its `examples/brax_minatar.ipynb` ("briefly tuned to do well on Gymnax's
# MinAtar environments"), which runs the same make_train as ppo.py (the same code, its wrappers
# imported from gymnax): 64 envs x 128 steps, 8 minibatches, relu, 1e7 steps.
PUREJAXRL_MINATAR = {
    **PUREJAXRL_PPO,
    "LR": 5e-3,
    "NUM_ENVS": 64,
    "TOTAL_TIMESTEPS": 10_000_000,
    "NUM_MINIBATCHES": 8,
    "ACTIVATION": "relu",
}
# What the kept runs of a MinAtar row showed, and what was checked about it (said on the page with them).
MINATAR_FINDINGS = {
    "Breakout": " A run stays on a plateau near 25 to 30 for its first 3 to 6M steps, then climbs to between 35 "
    "and 95, at a step and to a height that differ by seed, so six seeds, and even they do not order the "
    "three: ddprl on one device ends within one of PureJaxRL's standard deviations (Welch's t-test of the "
    "two means p = 0.16). The same row run on an AMD machine in an earlier sitting had ordered them the "
    "other way (training return PureJaxRL 42.0 ± 17.5, ddprl jax1 56.0 ± 25.5, jax 49.5 ± 17.6, 6 seeds). "
    "Checked beside it: with one minibatch per device's share, one and two devices compute the same "
    "iterations on this task (the losses agree to five significant digits over the first five "
    "iterations, then float drift). Time: ddprl on one device trains 6 % longer than PureJaxRL (107 s "
    "against 100 s) and compiles in 2.9 s against 4.1 s; end to end, with its evaluations, 118 s against "
    "108 s. Two simulated devices sharing the same 2 cores train in 127 s.",
    "SpaceInvaders": " ddprl ends above PureJaxRL on every seed (training return 180 to 185 against 165 to 172). "
    "From about 2M steps on, ddprl's greedy episodes run to gymnax's limit of 1,000 steps at nearly every "
    "evaluation: there the two differ in how they treat a time limit (PureJaxRL as a termination, ddprl "
    "bootstrapped, the list below). That this accounts for the gap is not tested: ddprl has no key to "
    "treat a time limit PureJaxRL's way.",
}
PEER_DEVICES = 2  # ddprl's JAX engine on 2 simulated CPU devices, its torch engine on 2 ranks
PEER_EVAL_FREQ = 50_000  # ddprl's greedy evaluations (10 episodes), outside the training time
# The runs of a peer row: PureJaxRL (one device), ddprl jax on one device (the engine against
# PureJaxRL alone) and on PEER_DEVICES (what sharding costs or gains), ddprl torch on PEER_DEVICES ranks.
IMPLS = {
    "purejaxrl": "PureJaxRL here",
    "jax1": "ddprl jax (1 device)",
    "jax": f"ddprl jax ({PEER_DEVICES} devices)",
    "torch": f"ddprl torch ({PEER_DEVICES} ranks)",
}
DEVICES = {"purejaxrl": 1, "jax1": 1, "jax": PEER_DEVICES, "torch": PEER_DEVICES}
DDPRL_IMPLS = ("jax1", "jax", "torch")


def ddprl_ppo_keys(config: dict, devices: int = PEER_DEVICES, eval_freq: int = PEER_EVAL_FREQ) -> tuple[str, ...]:
    """PureJaxRL's PPO ``config`` as ddprl's keys, for either engine on ``devices`` devices or ranks.

    ``num_envs`` is global in ddprl and ``batch_size`` per device or rank, so PureJaxRL's
    minibatch (NUM_ENVS x NUM_STEPS / NUM_MINIBATCHES samples) is ``batch_size`` x devices and
    each device cuts its share of the rollout into NUM_MINIBATCHES minibatches. PureJaxRL rounds
    TOTAL_TIMESTEPS down to whole updates, ddprl rounds ``steps`` up: ``steps`` is given as the
    whole updates, so that both run as many and anneal the learning rate over the same count.
    """
    rollout = config["NUM_ENVS"] * config["NUM_STEPS"]
    minibatch, rest = divmod(rollout, config["NUM_MINIBATCHES"])
    if rest or minibatch % devices or config["NUM_ENVS"] % devices:
        raise ValueError(f"{config}: the envs and minibatches do not split over {devices} devices")
    updates = int(config["TOTAL_TIMESTEPS"]) // rollout
    flag = {True: "true", False: "false"}
    return (
        "algo=ppo",
        f"steps={updates * rollout}",
        f"num_envs={config['NUM_ENVS']}",
        f"n_steps={config['NUM_STEPS']}",
        f"batch_size={minibatch // devices}",
        "sync_freq=1",  # one gradient average and optimizer step per minibatch
        f"epochs={config['UPDATE_EPOCHS']}",
        f"lr={config['LR']}",
        f"anneal_lr={flag[config['ANNEAL_LR']]}",  # both: lr x (1 - update / updates) in update i
        f"gamma={config['GAMMA']}",
        f"gae_lambda={config['GAE_LAMBDA']}",
        f"clip_coef={config['CLIP_EPS']}",
        "clip_vloss=true",  # ppo.py clips the value loss (max form) with CLIP_EPS, as ddprl does
        f"vf_coef={config['VF_COEF']}",  # both weigh 0.5 x the squared error by it
        f"ent_coef={config['ENT_COEF']}",
        f"max_grad_norm={config['MAX_GRAD_NORM']}",
        "target_kl=null",
        "norm_adv=true",  # ppo.py normalises per minibatch, ddprl over the whole rollout: PEER_NOTES
        "norm_obs=false",
        "norm_reward=false",
        "policy=mlp",  # separate actor and critic, orthogonal init (sqrt 2, 0.01, 1), as ppo.py
        "hidden_sizes=[64,64]",
        f"activation={config['ACTIVATION']}",
        f"eval_freq={eval_freq}",
        "eval_episodes=10",
        "eval_deterministic=true",
    )


@dataclass(frozen=True)
class PeerRow:
    """PureJaxRL's PPO and ddprl's two engines, each run here with PureJaxRL's hyperparameters
    (PUREJAXRL_PPO); the number compared is the training episodes' return, what PureJaxRL logs."""

    title: str
    task: str  # gymnax id: PureJaxRL's ENV_NAME and ddprl jax's task=gymnax/<id>
    torch_task: str | None  # the same task in Gymnasium, for ddprl's torch engine (None: gymnax only)
    note: str = ""
    base: tuple[tuple[str, object], ...] = tuple(PUREJAXRL_PPO.items())  # PureJaxRL's configuration
    eval_freq: int = PEER_EVAL_FREQ

    @property
    def impls(self) -> tuple[str, ...]:
        """The runs of each seed: every one of IMPLS, less ddprl torch for a gymnax-only task."""
        return tuple(impl for impl in IMPLS if impl != "torch" or self.torch_task)

    @property
    def ddprl_impls(self) -> tuple[str, ...]:
        """The ddprl runs among :attr:`impls` (the one other is PureJaxRL's)."""
        return tuple(impl for impl in self.impls if impl in DDPRL_IMPLS)

    def config(self, steps: int | None = None) -> dict:
        """PureJaxRL's config of this row (``steps``: a shorter TOTAL_TIMESTEPS, for a smoke run)."""
        return {**dict(self.base), "ENV_NAME": self.task, **({"TOTAL_TIMESTEPS": steps} if steps else {})}

    def keys(self, impl: str, steps: int | None = None) -> tuple[str, ...]:
        """The ``ddprl train`` keys of one of DDPRL_IMPLS."""
        devices = DEVICES[impl]
        if impl.startswith("jax"):
            engine = ("engine=jax", f"devices={devices}", f"task=gymnax/{self.task}")
        else:
            engine = ("engine=torch", f"world_size={devices}", f"task={self.torch_task}")
        return engine + ddprl_ppo_keys(self.config(steps), devices, self.eval_freq)

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys("jax"))


PEER_ROWS: dict[str, PeerRow] = {
    "jax-cartpole": PeerRow("PPO, CartPole-v1", "CartPole-v1", "CartPole-v1"),
    "jax-acrobot": PeerRow(
        "PPO, Acrobot-v1",
        "Acrobot-v1",
        "Acrobot-v1",
        note="ppo.py's configuration is CartPole's; PureJaxRL publishes no Acrobot one, so this row runs "
        "the same values on Acrobot (ddprl's Acrobot-v1 preset is overridden key by key).",
    ),
    **{
        f"jax-{game.lower()}": PeerRow(
            f"PPO, {game}-MinAtar",
            f"{game}-MinAtar",
            None,
            note="The configuration of PureJaxRL's `examples/brax_minatar.ipynb` (relu MLP on the flattened "
            "10 x 10 planes). MinAtar is a gymnax task only: no ddprl torch run. ddprl evaluates greedily "
            "(10 episodes) every 500k steps." + MINATAR_FINDINGS.get(game, ""),
            base=tuple(PUREJAXRL_MINATAR.items()),
            eval_freq=500_000,
        )
        for game in ("Breakout", "SpaceInvaders")
    },
}
# What differs between PureJaxRL's and ddprl's runs of a peer row, and why it stays (on the page).
PEER_NOTES = (
    "Advantages: PureJaxRL normalises them in each minibatch (its loss function), ddprl "
    "once over the whole rollout of every device (`norm_adv=true`); ddprl has no per-minibatch option.",
    "Time limits: PureJaxRL's `done` ends an episode at gymnax's step limit (500 for CartPole and Acrobot, "
    "1,000 for the MinAtar games) like a termination "
    "(no bootstrap: the value target past it is 0); ddprl bootstraps a truncated episode from the "
    "value of its last observation. ddprl has no key to treat truncation as termination.",
    "Minibatches: PureJaxRL shuffles the whole rollout, as ddprl jax on one device does; on 2 devices "
    "(ranks) each shuffles its own half and they average the gradients of their half-minibatches, which "
    "is the gradient of one minibatch drawn half from each device's environments.",
    "Environments: PureJaxRL and ddprl jax step gymnax 1.0.1's tasks; ddprl torch steps Gymnasium's "
    "CartPole-v1 and Acrobot-v1 (the tasks gymnax ports, float64 physics) and has no MinAtar. gymnax 1.0 "
    "returns terminated and truncated apart, PureJaxRL (written for gymnax < 1.0) reads one `done`: the "
    "runner hands it `terminated | truncated` through an adapter around `gymnax.make` (purejaxrl_ppo.py), "
    "its code unchanged.",
    "Metric: PureJaxRL's curve is its `returned_episode_returns` where `returned_episode`, the mean "
    "of the episodes that ended in each update, as ddprl's `train/episode_return`. (PureJaxRL's own plots "
    "average `returned_episode_returns` over every step and env, which repeats each env's last finished "
    "episode until its next one ends: smoother, and late by an episode.)",
    "Randomness: seed K is `jax.random.PRNGKey(K)` for PureJaxRL and ddprl's `seed=K`; the streams "
    "differ, so the seeds are independent draws for each, not the same runs.",
    "Timing: PureJaxRL's training is one compiled call (compile timed apart with `jax.jit(...).lower()"
    ".compile()`), with no evaluation and no logging on the way; ddprl's training time is the sum of "
    "its iterations' times (rollout and update), its evaluations and logging outside it. PureJaxRL "
    "and ddprl jax (1 device) run on one CPU device, ddprl jax (2 devices) on 2 simulated ones "
    "(`XLA_FLAGS=--xla_force_host_platform_device_count=2`) sharing the machine's 2 cores; all "
    "`JAX_PLATFORMS=cpu`.",
)
QMIX_SEEDS = 3  # the seeds each QMIX row, and EPyMARL's run on its task, are to have


def kept_summary(row: str) -> dict | None:
    path = RUNS / row / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def seed_curves(row: str, summary: dict) -> list[list[tuple[int, float]]]:
    """Each kept seed's evaluation curve, in the summary's order."""
    return [curve(read_rows(RUNS / row / f"seed{seed['seed']}")) for seed in summary["seeds"]]


def kept_random(row: str) -> tuple[str, dict] | None:
    """The random-action floor of a QMIX row's task (``--random``), kept in the folder of the
    task's row in QMIX_TASKS, and that row's name."""
    task_row = next((name for name in QMIX_TASKS if row.startswith(name)), None)
    if task_row is None or not (RUNS / task_row / "random.json").exists():
        return None
    return task_row, json.loads((RUNS / task_row / "random.json").read_text())


def against_epymarl(row: str) -> str:
    """A QMIX row's mean final test set against EPyMARL's run here on its task: within one of
    EPyMARL's standard deviations of its mean, above that, or how many of them below, with Welch's
    t-test of the two means there (how likely seed noise alone leaves a gap that size); nothing
    until each has 2 seeds (no standard deviation)."""
    from scipy.stats import ttest_ind

    ours, ref = kept_summary(row), epymarl_runs(ROWS[row])
    if not ours or not ref or len(ours["seeds"]) < 2 or len(ref["summary"]["seeds"]) < 2:
        return ""
    finals, ref_finals = ([s["final"] for s in kept["seeds"]] for kept in (ours, ref["summary"]))
    mean, ref_mean, ref_std = statistics.mean(finals), statistics.mean(ref_finals), statistics.stdev(ref_finals)
    if mean > ref_mean + ref_std:
        return ", above EPyMARL's by more than one std"
    if mean >= ref_mean - ref_std:
        return ", within one std of EPyMARL's"
    p = ttest_ind(finals, ref_finals, equal_var=False).pvalue
    below = f"{(ref_mean - mean) / ref_std:.2f} std below" if ref_std else "below"
    # The final test is one evaluation of each seed; Papoudakis et al.'s maximum returns (the
    # best evaluation of the mean curve) are what the paper ranks algorithms by.
    ours_max, ref_max = papoudakis_returns(seed_curves(row, ours)), papoudakis_returns(ref["curves"])
    inside = abs(ours_max["max_mean"] - ref_max["max_mean"]) <= ref_max["max_ci95"]
    return (
        f", {below} EPyMARL's (Welch's t-test p = {p:.2f}); its maximum returns "
        f"{'inside' if inside else 'outside'} EPyMARL's 95 % confidence interval"
    )


def qmix_seeds() -> list[str]:
    """Each QMIX task's seeds kept so far, counted from the rows' summaries (what is left to run
    is what this table lacks), with ddprl's mean final test against EPyMARL's."""
    lines = [
        "",
        "| task | ddprl's defaults | ddprl, EPyMARL's settings | EPyMARL run here | random actions |",
        "|---|---|---|---|---|",
    ]

    def seeds(row: str) -> str:
        kept = kept_summary(row)
        return f"{len(kept['seeds']) if kept else 0} of {QMIX_SEEDS}"

    for name, (task, agents) in QMIX_TASKS.items():
        cells = [seeds(row) + against_epymarl(row) for row in (name, name + "-epymarl")]
        cells.append(seeds(epymarl_row(name)))
        floor = kept_random(name)
        cells.append("not measured" if floor is None else f"{floor[1]['mean'] / agents:.2f}")
        lines.append(f"| {task} | {' | '.join(cells)} |")
    return lines + [""]


def rware_finals() -> str:
    """Random actions' return on rware-tiny against the best final test of any QMIX run kept there,
    ddprl's or EPyMARL's."""
    name = "qmix-rware-tiny-2ag"
    floor = kept_random(name)
    floor_text = "not measured yet" if floor is None else f"make {floor[1]['mean']:.2f} (`run.py {name} --random`)"
    kept = [kept_summary(row) for row in (name, name + "-epymarl", epymarl_row(name))]
    finals = [seed["final"] for summary in kept if summary for seed in summary["seeds"]]
    best = f"the highest final test of their {len(finals)} runs is {max(finals):.2f}" if finals else "no run yet"
    return f"random actions {floor_text}, and {best}"


RANDOM_EPISODES = 400


def random_baseline(name: str, episodes: int = RANDOM_EPISODES, seed: int = 0) -> dict:
    """The team return of uniformly random available actions on a QMIX row's task, through the
    environment ddprl trains on (8 copies, seeded ``seed``; the actions drawn from a generator
    seeded the same): the floor a learned policy has to clear. Kept as ``random.json`` in the row's
    folder (``run.py ROW --random``)."""
    import torch

    from ddprl.envs.marl import make_marl_env

    task, _ = QMIX_TASKS[name]
    env = make_marl_env(task, num_envs=8, seed=seed)
    draws = torch.Generator().manual_seed(seed)
    obs, returns = env.reset(), []
    while len(returns) < episodes:
        avail = obs.avail.flatten(0, 1).float()
        actions = torch.multinomial(avail, 1, generator=draws).view(env.num_envs, env.n_agents)
        obs, _, terminated, truncated, info = env.step(actions)
        returns += info["episode_return"][terminated | truncated].tolist()
    env.close()
    returns = returns[:episodes]
    result = {
        "task": task,
        "episodes": episodes,
        "seed": seed,
        "mean": statistics.mean(returns),
        "std": statistics.stdev(returns),
        "positive": sum(r > 0 for r in returns),
    }
    (RUNS / name).mkdir(parents=True, exist_ok=True)
    (RUNS / name / "random.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def random_line(name: str, agents: int, digits: int) -> list[str]:
    """A QMIX row's detail line for the random-action floor of its task, where it is kept."""
    if (floor := kept_random(name)) is None:
        return []
    base, kept = floor
    return [
        f"- random actions (`python benchmarks/results/run.py {base} --random`): {kept['mean'] / agents:.{digits}f} "
        f"± {kept['std'] / agents:.{digits}f} over {kept['episodes']} episodes, {kept['positive']} of them with a "
        "return above 0 (uniform over each agent's available actions, ddprl's environment)"
    ]


def not_yet() -> list[str]:
    """The page's 'not reproduced yet': what is missing, with the QMIX seeds counted from the runs kept."""
    qmix_missing = (
        "QMIX on EPyMARL's protocol (2M environment steps, 100 greedy test episodes every 50k): ddprl's defaults "
        "and EPyMARL's settings on five tasks are rows above. Papoudakis et al. 2021 (arXiv 2006.07869) Table 3 "
        "is not transcribed: no copy of the table was reachable from the machines these pages were made on. The "
        "reference that stands in for it is EPyMARL itself, run here on the same task and protocol (`run.py "
        "epymarl-<task>`, also on simple_spread, through PettingZoo 1.24.3). The table below counts the seeds "
        f"kept of each, of the {QMIX_SEEDS} each is to have (`--resume` adds the others), and sets ddprl's mean "
        "final test against EPyMARL's, in EPyMARL's standard deviations, where each has 2 seeds or more; where "
        "ddprl's is more than one below, Welch's t-test of the two means: p is the chance that seeds alone, the "
        "means being equal, part them that far (with 3 seeds a side, EPyMARL's standard deviation is itself a "
        "rough estimate) and whether ddprl's maximum returns fall inside EPyMARL's 95 % confidence interval. "
        "On Foraging-2s-8x8-2p-2f-coop-v3 both ddprl rows end below EPyMARL on the final test (0.55 ± 0.11 "
        "and 0.49 ± 0.22 against 0.67 ± 0.06): one seed of each drops at its last test (to 0.43 and 0.24, "
        "from bests of 0.66 and 0.56) while the curves follow EPyMARL's mean throughout (their PNGs); on the "
        "paper's own measure, maximum returns, both fall inside EPyMARL's confidence interval (0.63 and 0.65 "
        "against 0.69 ± 0.11), and over each seed's last five tests the gap is 1.1 and 1.2 of EPyMARL's "
        "standard deviations (Welch's p 0.18 and 0.43). On Foraging-8x8-2p-2f-coop-v3 the two ddprl rows "
        "trade places between the final test (defaults within one std, EPyMARL's settings 1.01 below) and "
        "the last five tests (1.42 and 0.73 below). Three seeds a side do not resolve gaps this size; the "
        "paper's five would narrow them. Its last column is the team return of uniformly random actions "
        f"({RANDOM_EPISODES} episodes, `run.py ROW --random`; per agent on simple_spread), the floor a policy has "
        "to clear. On Foraging-10x10-3p-3f-v3 neither EPyMARL nor ddprl learns much in 2M steps: both end near "
        "their first tests, below random actions (the row above and its task note). On simple_spread QMIX with "
        "time limits bootstrapped "
        "diverged (the row 'time limits bootstrapped': mean Q 24 at 110k, 15,000 at 1.2M, the greedy return "
        "from -20 to -50 per agent): ddprl's task preset for the cooperative MPE tasks now treats their time "
        "limit as terminal, as EPyMARL does (docs/qmix.md, 'Time limits on MPE'). On rware-tiny-2ag-v2, which "
        "pays only for delivering a requested shelf, neither library's greedy policy learns to deliver in 2.05M "
        f"steps: {rware_finals()}. A ddprl seed took 9 to 22 min alone on the 2-core Intel machine, 16 to 40 "
        "beside other jobs, 23 to 38 min on the AMD one; an EPyMARL seed 96 min (LBF 8x8, three of them and a "
        "ddprl run sharing the Intel machine's 2 cores), 71 min (2s-8x8, three of them alone), 84 to 87 min (10x10, "
        "two of them and a ddprl run, or one beside another EPyMARL run and a TD-MPC2 run), 53 to 59 min "
        "(simple_spread, one of them and a ddprl run; 92 min beside another EPyMARL run and a TD-MPC2 run) and "
        "85 to 98 min (rware-tiny: 90 beside a ddprl run; 98 and 85 beside two TD-MPC2 runs and the test suite)."
    )
    csv = ", ".join(f"{task} {' / '.join(f'{v:g}' for v in values)}" for task, values in TDMPC2_TASKS.items())
    gpu_seeds = ", ".join(
        f"{row.key('task')} {len(kept_seeds(RUNS / name, name, row.command(), 3))}"
        for name, row in ROWS.items()
        if row.key("device") == "cuda"
    )
    tdmpc2_missing = (
        "TD-MPC2 at 100k environment steps (50k agent steps, action repeat 2) against the official per-task CSVs "
        f"(github.com/nicklashansen/tdmpc2, `results/tdmpc2/`, 3 seeds, at 100k: {csv}): at model_size 1 this "
        "CPU makes about 2.5 agent steps per second on a core (docs/benchmarks.md), about 6 hours per seed, so "
        "the CPU carries cartpole-swingup only: its row trains across sittings, two seeds at once, each going on "
        "from its checkpoint and replay buffer (`run.py tdmpc2-cartpole-swingup --seeds 3 --jobs 2 --resume`; "
        "its row above says how far each seed got, and how far a first attempt got before its checkpoints went "
        "with the machine they were on). On a GPU the CSVs' own model trains a seed in 9 to 11 min "
        "(the rows 'model_size 5, one GPU'), but a session gets 15 min of a GPU when it gets one at all, about "
        f"one seed: seeds kept so far of 3, {gpu_seeds}. docs/benchmarks.md has a 30k-step cartpole-swingup "
        "run on 2 ranks."
    )
    return [
        "",
        "## Not reproduced yet",
        "",
        "- PPO on Ant-v5 and Humanoid-v5: their rows above are not run yet (`run.py ppo-ant --seeds 3`, the",
        "  same for `ppo-humanoid`); the 2-core machine these pages are made on has been training TD-MPC2 since.",
        "  1M MuJoCo steps with CleanRL's minibatch on 2 ranks take 20 to 25 min per seed on it when it is",
        "  otherwise idle, 36 to 50 min beside another job (Hopper's and Walker2d's seeds ran beside other jobs).",
        *textwrap.wrap(qmix_missing, 100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False),
        *qmix_seeds(),
        *textwrap.wrap(tdmpc2_missing, 100, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False),
    ]


def sklearn_baselines(dataset: str, seed: int) -> dict[str, float]:
    """Test accuracy of scikit-learn models on ddprl's split (split_seed=0, standardised with the
    training statistics), fitted on train + val."""
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    from ddprl.supervised.tasks import _tabular_splits

    splits = _tabular_splits(dataset, 0)
    x_fit = torch.cat([splits["train"][0], splits["val"][0]]).numpy()
    y_fit = torch.cat([splits["train"][1], splits["val"][1]]).numpy()
    x_test, y_test = (t.numpy() for t in splits["test"])
    models = {
        "scikit-learn LogisticRegression": LogisticRegression(max_iter=5000),
        "scikit-learn MLPClassifier (128, 128), early stopping": MLPClassifier(
            (128, 128), early_stopping=True, max_iter=500, random_state=seed
        ),
    }
    return {name: float(model.fit(x_fit, y_fit).score(x_test, y_test)) for name, model in models.items()}


GRAPH_BINS = 100


@functools.cache  # the same for every seed: generated from the split seed, fitted deterministically
def graph_baselines() -> dict[str, float]:
    """Test MSE (of the standardised energy) on ddprl's graph_energy split (its default options):
    the training mean, and a linear model on what the energy is a function of, the number of
    particle pairs at each distance (edges counted in GRAPH_BINS distance bins up to the cutoff).
    The linear model is told the answer's form (a sum of pair terms), the GNN is not: a bound
    rather than a peer."""
    import numpy as np
    import torch
    from sklearn.linear_model import RidgeCV

    from ddprl.supervised.graph import OPTIONS, graph_splits

    splits = graph_splits(*(OPTIONS[k] for k in ("num_graphs", "min_nodes", "max_nodes", "radius", "split_seed")))
    edges = np.linspace(0.0, OPTIONS["radius"], GRAPH_BINS + 1)

    def features(graphs) -> tuple[np.ndarray, np.ndarray]:
        counts = []
        for g in graphs:
            src, dst = g.edge_index
            d = torch.linalg.vector_norm(g.pos[dst] - g.pos[src], dim=1)[src < dst]  # each pair once
            counts.append(np.histogram(d.numpy(), bins=edges)[0])
        return np.array(counts, dtype=np.float64), np.array([g.y.item() for g in graphs])

    x_fit, y_fit = features(splits["train"] + splits["val"])
    x_test, y_test = features(splits["test"])
    predicted = RidgeCV(alphas=np.logspace(-6, 2, 9)).fit(x_fit, y_fit).predict(x_test)
    return {
        "the training mean": float(np.mean((y_fit.mean() - y_test) ** 2)),
        f"scikit-learn RidgeCV on pair counts in {GRAPH_BINS} distance bins": float(np.mean((predicted - y_test) ** 2)),
    }


def read_rows(run: Path) -> list[dict]:
    """The rows of a kept run's metrics (``metrics.jsonl.gz``, or ``metrics.jsonl`` as written)."""
    from ddprl.metrics import read_metrics

    return read_metrics(run)


def pack(keep: Path) -> None:
    """``keep/metrics.jsonl`` -> ``metrics.jsonl.gz`` (a fifth of the size; ``ddprl plot`` and
    ``read_metrics`` read either). The kept runs travel with every copy of the repository, the
    GPU machine's included, whose working tree is limited in size."""
    plain = keep / "metrics.jsonl"
    with plain.open("rb") as src, gzip.GzipFile(keep / "metrics.jsonl.gz", "wb", 9, mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def curve(rows: list[dict], key: str = EVAL) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if key in r]


def at_steps(points: list[tuple[int, float]], steps: int) -> float | None:
    """The last evaluation at or before ``steps`` (a run's budget rounds up to whole iterations, so
    the final evaluation may lie a little past it: it counts when within 2.5 %)."""
    done = [ret for step, ret in points if step <= steps * 1.025]
    return done[-1] if done else None


def window_mean(points: list[tuple[int, float]], steps: int) -> float | None:
    """The mean training-episode return logged over the last 5 % of ``steps``: one iteration's
    value is the mean of the few episodes that ended in it, too noisy to stand alone."""
    window = [ret for step, ret in points if steps * 0.95 < step <= steps * 1.025]
    return statistics.mean(window) if window else None


def confidence95(values: list[float]) -> float:
    """Half the width of the 95 % confidence interval of the mean of ``values`` (Student's t)."""
    from scipy.stats import t

    return float(t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5)


def across_seeds(curves: list[list[tuple[int, float]]]) -> dict[int, list[float]]:
    """``{step: each curve's value there}`` for the evaluation steps every one of ``curves`` has, in order."""
    steps = sorted(set.intersection(*(set(dict(c)) for c in curves)))
    return {step: [dict(c)[step] for c in curves] for step in steps}


def per_agent(curves: list[list[tuple[int, float]]], agents: int) -> list[list[tuple[int, float]]]:
    """Team-return curves divided by the agents (the page's unit on MPE, as Papoudakis et al.'s)."""
    return [[(step, r / agents) for step, r in c] for c in curves]


def papoudakis_returns(curves: list[list[tuple[int, float]]]) -> dict:
    """Papoudakis et al. 2021's two measures of a row's runs (each seed's evaluation curve):
    maximum returns, the evaluation step at which the mean over seeds is highest, with the mean
    and its 95 % confidence interval there; average returns, each seed's mean over all its
    evaluations, then the mean and interval of those. Steps every seed evaluated at only."""
    at = across_seeds(curves)
    best = max(at, key=lambda step: statistics.mean(at[step]))
    averages = [statistics.mean(r for step, r in c if step in at) for c in curves]
    return {
        "max_step": best,
        "max_mean": statistics.mean(at[best]),
        "max_ci95": confidence95(at[best]),
        "average_mean": statistics.mean(averages),
        "average_ci95": confidence95(averages),
    }


def measure(rows: list[dict], ref: Reference) -> float | None:
    """ddprl's number to set beside ``ref``, measured as ``ref`` is (``rows``: a run's metrics)."""
    if ref.metric == TRAIN:
        return window_mean(curve(rows, TRAIN), ref.steps)
    return at_steps(curve(rows, ref.metric), ref.steps)


class Stopped(Exception):
    """A long row's run stopped by SIGTERM/SIGUSR1 with a checkpoint saved (``ddprl train`` exit 75)."""


LIVE_RUNS: set[subprocess.Popen] = set()  # the ddprl processes this script waits on
STOPPING = threading.Event()  # a stop signal came: no seed starts after it


def pass_on_stop_signals() -> None:
    """SIGTERM or SIGUSR1 to this script goes on to the runs it started: a long row's run then saves
    a checkpoint and exits 75 (``--resume`` goes on from it), any other run stops; no further seed
    starts. TD-MPC2 acts on it at its next agent step, or when its pretraining burst ends (the
    burst is one step: ~20 min at model_size 1 on a core of the 2-core CPU)."""

    def forward(signum: int, frame: object) -> None:
        STOPPING.set()
        for proc in list(LIVE_RUNS):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)


def train_and_keep(
    keys: tuple[str, ...], seed: int, keep: Path, what: str, env: dict | None = None, work: Path | None = None
) -> float:
    """``ddprl train KEYS seed=SEED`` in a scratch directory; its metrics.jsonl and config.yaml
    copied to ``keep``. Returns the wall time of the whole command (start-up included).

    ``work`` (long rows): train in that directory instead, going on from its latest checkpoint
    where an earlier sitting left one; a run stopped with a checkpoint raises :class:`Stopped`, a
    finished one's directory is removed once kept. Its wall time is then the sum of its sittings'
    (each one's whole command, kept in ``SITTINGS`` as it ends: the metrics' ``wall_time`` restarts
    in each process, and nothing marks where when a sitting was short)."""
    with contextlib.ExitStack() as stack:
        run_dir = work or Path(stack.enter_context(tempfile.TemporaryDirectory())) / "run"
        resume = work is not None and (work / "checkpoints" / "latest.pt").exists()
        set_keys = {key.split("=")[0] for key in keys}
        common = [key for key in COMMON if key.split("=")[0] not in set_keys]  # the row's own keys win
        cmd = [sys.executable, "-m", "ddprl", "train", *keys, *common, f"seed={seed}", f"run_dir={run_dir}"]
        cmd += ["resume=auto"] if resume else []
        print("$", " ".join(cmd[2:]), flush=True)
        start = time.time()
        env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "disable"), **(env or {})}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        LIVE_RUNS.add(proc)
        try:
            code = proc.wait()
        finally:
            LIVE_RUNS.discard(proc)
        progress = keep.parent / IN_PROGRESS / keep.name
        if work is not None and work.is_dir():  # a run refused at its start (exit 2) made no directory
            (work / SITTINGS).write_text(json.dumps([*sittings(work), round(time.time() - start, 1)]) + "\n")
            if code == 75:
                keep_run(run_dir, progress, SITTINGS)  # how far it got, on the page until the seed ends
                raise Stopped(f"{what}: stopped with a checkpoint in {work}; `--resume` goes on from it")
        if code != 0:
            raise SystemExit(f"{what}: ddprl train exited {code}")
        if work is not None:  # ended: its in-progress copy gives way to the kept run
            shutil.rmtree(progress, ignore_errors=True)
            with contextlib.suppress(OSError):
                progress.parent.rmdir()  # once empty
        keep_run(run_dir, keep)
    if work is None:
        return round(time.time() - start, 1)
    wall = sum(sittings(work))
    shutil.rmtree(work)
    return round(wall, 1)


def sittings(run: Path) -> list[float]:
    """The wall time of each sitting of a long row's run so far (``SITTINGS``; none yet: [])."""
    path = run / SITTINGS
    return json.loads(path.read_text()) if path.exists() else []


def keep_run(run_dir: Path, keep: Path, *more: str) -> None:
    """A run's metrics.jsonl (gzipped), config.yaml and the ``more`` files, copied to ``keep``
    (replacing what it held)."""
    keep.mkdir(parents=True, exist_ok=True)
    for file in ("metrics.jsonl", "config.yaml", *more):
        shutil.copy(run_dir / file, keep / file)
    pack(keep)


def in_progress(name: str, folder: str = IN_PROGRESS) -> list[dict]:
    """A long row's seeds stopped part-way, as each one's last sitting left it: its seed, last step,
    evaluations so far and training time so far (the sum of its sittings). ``folder=LOST``: the
    attempts set aside by :func:`set_aside_lost` instead."""
    seeds = []
    for keep in sorted((RUNS / name / folder).glob("seed*")):
        rows = read_rows(keep)
        wall = sum(sittings(keep))
        seeds.append({"seed": seed_of(keep.name), "step": rows[-1]["step"], "evals": curve(rows), "wall_s": wall})
    return seeds


def seed_of(name: str) -> int:
    """The seed a kept run's directory or its curve's label names: seed<K>, seed<K>-<N>, 'seed<K>, lost'."""
    return int(re.match(r"seed(\d+)", name)[1])


def set_aside_lost(out: Path, seed: int, work: Path) -> Path | None:
    """Move a long row's in-progress record of ``seed`` to ``out/LOST/`` when ``work`` holds no
    checkpoint to go on from (the work directory is not committed: a sitting on a new machine finds
    none). The seed then starts again, and its fresh record would otherwise overwrite how far the
    lost attempt got. Returns where the record went (None: nothing to set aside)."""
    progress = out / IN_PROGRESS / f"seed{seed}"
    if not progress.is_dir() or (work / "checkpoints" / "latest.pt").exists():
        return None
    lost = out / LOST / f"seed{seed}"
    attempt = 2
    while lost.exists():  # a seed lost twice keeps both
        lost, attempt = out / LOST / f"seed{seed}-{attempt}", attempt + 1
    lost.parent.mkdir(parents=True, exist_ok=True)
    progress.rename(lost)
    with contextlib.suppress(OSError):
        progress.parent.rmdir()  # once empty
    return lost


def run_row(name: str, seeds: int, resume: bool = False, jobs: int = 1) -> dict:
    """Train seeds 1..``seeds`` of a row, ``jobs`` at once, keep each run and rewrite
    ``summary.json`` as each seed ends (a row stopped part-way keeps the seeds it finished).
    ``resume``: keep the seeds the summary already holds and train only the others (a long row
    across several sittings: each of its seeds also goes on from where the last sitting stopped it)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    row = ROWS.get(name) or SUPERVISED_ROWS[name]
    out = RUNS / name
    results, missing = seeds_to_train(out, name, row.command(), seeds, resume)
    at_once = max(1, min(jobs, len(missing)))

    halt = threading.Event()  # a run failed or was stopped: no seed starts after it

    def one(seed: int) -> float | None:
        if halt.is_set() or STOPPING.is_set():
            return None
        work = WORK / name / f"seed{seed}" if getattr(row, "long", False) else None
        if work is not None and not resume:  # not resuming: no seed goes on from an earlier sitting either
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(out / IN_PROGRESS / f"seed{seed}", ignore_errors=True)
            for lost in (out / LOST).glob("seed*"):
                if seed_of(lost.name) == seed:
                    shutil.rmtree(lost)
        elif work is not None and (lost := set_aside_lost(out, seed, work)):
            print(
                f"{name} seed {seed}: no checkpoint in {work} to go on from: starts again; "
                f"how far it got is kept in {lost.relative_to(ROOT)}",
                flush=True,
            )
        try:
            return train_and_keep(row.keys, seed, out / f"seed{seed}", f"{name} seed {seed}", work=work)
        except (SystemExit, Stopped):
            halt.set()
            raise

    stopped, failed = [], []
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        runs = {pool.submit(one, seed): seed for seed in missing}
        for done in as_completed(runs):
            seed = runs[done]
            try:
                wall = done.result()
            except Stopped as e:
                print(e, flush=True)
                stopped.append(seed)
                continue
            except SystemExit as e:  # a failed run: no seed starts after it, those running are kept
                print(e, flush=True)
                failed.append(str(e))
                continue
            if wall is None:  # not started: an earlier run failed or was stopped
                continue
            keep = out / f"seed{seed}"
            if isinstance(row, SupervisedRow):
                final = read_rows(keep)[-1]
                entry = {
                    "seed": seed,
                    "wall_s": wall,
                    f"test/{row.metric}": final[f"test/{row.metric}"],
                    "baselines": row.baselines(seed),
                }
            else:
                rows = read_rows(keep)
                at_reference = [measure(rows, ref) for ref in row.references]
                entry = {**seed_summary(seed, wall, curve(rows)), "at_reference": at_reference}
            results.append({**entry, **({"jobs": at_once} if at_once > 1 else {})})
            print(f"{name} seed {seed}: {results[-1]}", flush=True)
            results.sort(key=lambda s: s["seed"])
            write_summary(out, name, row.command(), results)
    if failed:
        raise SystemExit(failed[0])
    if stopped:
        raise SystemExit(75)  # as ddprl's own exit: stopped with checkpoints, `--resume` goes on
    return json.loads((out / "summary.json").read_text())  # also when every seed was kept


def kept_seeds(out: Path, name: str, command: str, seeds: int) -> list[dict]:
    """The seeds (up to ``seeds``) that ``out/summary.json`` holds and whose runs are kept; refuses
    a summary made by another command (a row whose keys changed since)."""
    if not (out / "summary.json").exists():
        return []
    done = json.loads((out / "summary.json").read_text())
    if done["command"] != command:
        raise SystemExit(f"{name}: the kept seeds ran `{done['command']}`, the row now runs `{command}`")
    kept = [s for s in done["seeds"] if s["seed"] <= seeds and (out / f"seed{s['seed']}").is_dir()]
    return [{**s, "machine": seed_machine(s, done)} for s in kept]  # the summary's machine is the last seed's


def seeds_to_train(out: Path, name: str, command: str, seeds: int, resume: bool) -> tuple[list[dict], list[int]]:
    """The seeds kept from earlier sittings (``resume``: :func:`kept_seeds`; none otherwise) and the
    seeds of 1..``seeds`` still to train."""
    kept = kept_seeds(out, name, command, seeds) if resume else []
    for seed in sorted(s["seed"] for s in kept):
        print(f"{name} seed {seed}: kept from an earlier sitting", flush=True)
    return kept, [seed for seed in range(1, seeds + 1) if all(s["seed"] != seed for s in kept)]


@functools.cache
def this_machine() -> str:
    """The CPU and its cores, after the GPU's name where ``nvidia-smi`` finds one (a GPU row's machine)."""
    from machine import cpu_model

    cpu = f"{cpu_model()}, {os.cpu_count()} cores"
    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):  # no driver here: a CPU machine
        return cpu
    return f"{gpus[0].strip()}, {cpu}" if gpus and gpus[0].strip() else cpu


def seed_machine(seed: dict, summary: dict) -> str:
    """The machine a kept seed ran on (summaries older than the per-seed entry name one for all)."""
    return seed.get("machine", summary["machine"])


def seed_summary(seed: int, wall: float, evals: list[tuple[int, float]]) -> dict:
    """What a row's summary keeps of one seed's evaluation curve."""
    return {
        "seed": seed,
        "wall_s": wall,
        "final": evals[-1][1],
        "final_step": evals[-1][0],
        "best": max(r for _, r in evals),
        "machine": this_machine(),
    }


def write_summary(out: Path, name: str, command: str, seeds: list[dict], **extra: str) -> None:
    summary = {
        "row": name,
        "command": command,
        **extra,
        "machine": this_machine(),
        "date": time.strftime("%Y-%m-%d"),
        "seeds": seeds,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def epymarl_settings(task: str, seed: int, checkout: Path, python: str) -> argparse.Namespace:
    """qmix_learning's settings of an EPyMARL run on ``task``: EPyMARL's protocol."""
    return argparse.Namespace(
        task=task,
        steps=QMIX_STEPS,
        eval_freq=QMIX_EVAL_FREQ,
        eval_episodes=QMIX_EVAL_EPISODES,
        seed=seed,
        epymarl=str(checkout),
        epymarl_python=python,
    )


def epymarl_row_command(task: str) -> str:
    """The EPyMARL command line of a row, as one types it in EPyMARL's tree (``seed=K`` apart)."""
    from qmix_learning import epymarl_command

    args = epymarl_command(epymarl_settings(task, 0, Path("epymarl"), "python"))[3:]
    return "python src/main.py " + " ".join(a for a in args if not a.startswith("seed="))


def run_epymarl_row(
    name: str, seeds: int, checkout: Path, python: str | None, resume: bool = False, jobs: int = 1
) -> None:
    """Run EPyMARL's QMIX on the row's task, seeds 1..``seeds`` (``benchmarks/epymarl_probe.py``
    starts its unchanged ``src/main.py`` from ``checkout`` under ``python``); keep each seed's
    tests as ``seed<K>/metrics.jsonl.gz`` (``step``: the test's step on the 50k grid, ``t_env``:
    the step it ran at) and the summary, as ``run_row`` does. EPyMARL runs on one core
    (``OMP_NUM_THREADS=1``, its episode runner): ``jobs`` seeds run at once, each one's wall time
    measured beside the others (the summary says how many)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from qmix_learning import grid_step, run_epymarl
    from qmix_speed import EPYMARL_VENV, epymarl_commit, versions

    if not python or not Path(python).exists():
        raise SystemExit(f"{name} runs EPyMARL: --epymarl-python, the python of its environment ({EPYMARL_VENV})")
    if not (checkout / "src" / "main.py").is_file():
        raise SystemExit(f"{name}: {checkout} is not an EPyMARL tree (no src/main.py)")
    task = EPYMARL_ROWS[name]
    out = RUNS / name
    command = epymarl_row_command(task)
    results, missing = seeds_to_train(out, name, command, seeds, resume)
    at_once = min(jobs, len(missing))
    peer = {"epymarl_commit": epymarl_commit(str(checkout)), "epymarl_versions": versions(python)}

    def one(seed: int) -> tuple[dict[int, float], float]:
        print(f"$ {command} seed={seed}  (in {checkout})", flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            return run_epymarl(epymarl_settings(task, seed, checkout, python), Path(scratch))

    failed = []
    with ThreadPoolExecutor(max_workers=max(at_once, 1)) as pool:
        runs = {pool.submit(one, seed): seed for seed in missing}
        for done in as_completed(runs):  # each seed kept as it finishes: a stopped row keeps them
            seed = runs[done]
            try:
                tests, wall = done.result()
            except RuntimeError as e:
                print(f"{name} seed {seed}: EPyMARL failed: {e}", flush=True)
                failed.append(seed)
                continue
            keep = out / f"seed{seed}"
            keep.mkdir(parents=True, exist_ok=True)
            records = [{"step": grid_step(t, QMIX_EVAL_FREQ), "t_env": t, EVAL: r} for t, r in sorted(tests.items())]
            (keep / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            pack(keep)
            results.append({**seed_summary(seed, round(wall, 1), curve(records)), "jobs": at_once})
            print(f"{name} seed {seed}: {results[-1]}", flush=True)
            results.sort(key=lambda s: s["seed"])
            write_summary(out, name, command, results, **peer)
    if failed:
        raise SystemExit(f"{name}: EPyMARL failed on seed(s) {failed}; `--resume` runs them again")


def check_purejaxrl(checkout: Path, python: str | None) -> None:
    """Refuse a checkout at another commit than PUREJAXRL_COMMIT, or no python to run it with."""
    if not python or not Path(python).exists():
        raise SystemExit(
            f"peer rows run PureJaxRL with the python of its own environment: --purejaxrl-python PATH "
            f"(or PUREJAXRL_PYTHON); make one with: {PUREJAXRL_VENV}"
        )
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0 or head.stdout.strip() != PUREJAXRL_COMMIT:
        found = head.stdout.strip() or "no git checkout"
        raise SystemExit(f"--purejaxrl {checkout}: {found}, not PureJaxRL at {PUREJAXRL_COMMIT}; {PUREJAXRL_CLONE}")


def jax_env(devices: int) -> dict[str, str]:
    """The environment of a JAX process on the CPU with ``devices`` simulated devices (XLA reads
    the flag when JAX starts, so it is set for the child)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return {"XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}


def impl_env(impl: str) -> dict[str, str]:
    """The environment variables a ddprl run of a peer row sets (its JAX devices; none for torch)."""
    return jax_env(DEVICES[impl]) if impl.startswith("jax") else {}


def run_purejaxrl(config: dict, seed: int, keep: Path, checkout: Path, python: str) -> float:
    """PureJaxRL's ``make_train(config)`` with PRNGKey(seed), in its own environment; its
    metrics.jsonl and result.json kept under ``keep``. Returns the command's wall time."""
    cmd = [python, str(HERE / "purejaxrl_ppo.py"), "--purejaxrl", str(checkout), "--seed", str(seed)]
    cmd += ["--out", str(keep), "--config", json.dumps(config)]
    print("$ purejaxrl_ppo.py --seed", seed, json.dumps(config), flush=True)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **jax_env(1)})
    if proc.returncode != 0:
        raise SystemExit(f"PureJaxRL seed {seed}: exited {proc.returncode}")
    pack(keep)
    return round(time.time() - start, 1)


def peer_measures(keep: Path, impl: str, wall: float, steps: int) -> dict:
    """One run's numbers for the page: the training episodes' return over the last 5 % of
    ``steps``, ddprl's last greedy evaluation, and its times (end to end, compile, training)."""
    rows = read_rows(keep)
    if impl == "purejaxrl":
        result = json.loads((keep / "result.json").read_text())
        compile_s, train_s = result["compile_s"], result["train_s"]
    elif impl.startswith("jax"):
        compile_s, train_s = rows[0].get("time/compile_s"), sum(r["time/iteration_s"] for r in rows)
    else:  # the torch engine compiles nothing here (compile=false)
        compile_s, train_s = None, sum(r["time/rollout_s"] + r["time/update_s"] for r in rows)
    evals = curve(rows)
    return {
        "wall_s": wall,
        "compile_s": None if compile_s is None else round(compile_s, 1),
        "train_s": round(train_s, 1),
        "train_return": window_mean(curve(rows, TRAIN), steps),
        "eval_return": evals[-1][1] if evals else None,
        "final_step": rows[-1]["step"],
    }


def run_peer_row(
    name: str, seeds: int, checkout: Path, python: str | None, steps: int | None = None, resume: bool = False
) -> dict:
    """Each seed: PureJaxRL, then ddprl jax (1, then 2 devices), then ddprl torch, one at a time;
    ``summary.json`` rewritten after each seed. ``resume``: keep the seeds the summary already
    holds when it ran the same commands, and run only the others (``--seeds 6`` adds 4 to 6)."""
    from machine import cpu_model

    check_purejaxrl(checkout, python)
    row = PEER_ROWS[name]
    config = row.config(steps)
    rollout = config["NUM_ENVS"] * config["NUM_STEPS"]
    budget = int(config["TOTAL_TIMESTEPS"]) // rollout * rollout  # whole updates, for every run
    out = RUNS / name
    commands = {
        impl: " ".join(f"{k}={v}" for k, v in impl_env(impl).items() if v)
        + " ddprl train "
        + " ".join(row.keys(impl, steps))
        for impl in row.ddprl_impls
    }
    results = []
    if resume and (out / "summary.json").exists():
        done = json.loads((out / "summary.json").read_text())
        if (done["commands"], done["purejaxrl"]["config"], done["steps"]) != (commands, config, budget):
            raise SystemExit(
                f"{name}: the kept seeds ran other commands than the row now gives; run it without --resume"
            )
        impls = ("purejaxrl", *row.ddprl_impls)
        results = [
            s
            for s in done["seeds"]
            if s["seed"] <= seeds and all((out / f"{impl}-seed{s['seed']}").is_dir() for impl in impls)
        ]
    for seed in range(1, seeds + 1):
        if any(s["seed"] == seed for s in results):
            print(f"{name} seed {seed}: kept from an earlier sitting", flush=True)
            continue
        result: dict = {"seed": seed}
        keep = out / f"purejaxrl-seed{seed}"
        wall = run_purejaxrl(config, seed, keep, checkout, python)
        result["purejaxrl"] = peer_measures(keep, "purejaxrl", wall, budget)
        for impl in row.ddprl_impls:
            keep = out / f"{impl}-seed{seed}"
            wall = train_and_keep(row.keys(impl, steps), seed, keep, f"{name} {impl} seed {seed}", impl_env(impl))
            result[impl] = peer_measures(keep, impl, wall, budget)
        print(f"{name} seed {seed}: {result}", flush=True)
        results = sorted([*results, result], key=lambda s: s["seed"])
        first = results[0]["seed"]
        versions = json.loads((out / f"purejaxrl-seed{first}" / "result.json").read_text())["versions"]
        summary = {
            "row": name,
            "steps": budget,
            "commands": commands,
            "purejaxrl": {"commit": PUREJAXRL_COMMIT, "config": config, "versions": versions},
            "machine": f"{cpu_model()}, {os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d"),
            "seeds": results,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return json.loads((out / "summary.json").read_text())  # also when every seed was kept


def mean_std(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (1 seed)"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def draw(name: str, row: Row, peer: dict | None = None) -> Path:
    """Every seed's curves (``ddprl.plot``): the evaluation return, and the training episodes' return
    where a reference is measured on it, each reference drawn as a line and band on its metric."""
    from ddprl.plot import figure, load_runs

    runs = load_runs(sorted((RUNS / name).glob("seed*")))
    partial = load_runs(sorted((RUNS / name / IN_PROGRESS).glob("seed*")))
    runs.update({f"{label}, in progress": records for label, records in partial.items()})
    lost = {
        f"{label}, lost": records for label, records in load_runs(sorted((RUNS / name / LOST).glob("seed*"))).items()
    }
    # A lost attempt dashed, in the colour of its seed's run where there is one: two attempts of one
    # seed train alike up to the lost one's first resume (a resumed DMC run starts new episodes from
    # other seeds, docs/distributed.md), and the lines lie on each other that far.
    colour = {seed_of(label): f"C{i}" for i, label in enumerate(runs)}
    styles = {
        label: {"linestyle": "--", **({"color": colour[seed_of(label)]} if seed_of(label) in colour else {})}
        for label in lost
    }
    runs.update(lost)
    metrics = [EVAL] + ([TRAIN] if any(ref.metric == TRAIN for ref in row.references) else [])
    fig = figure(runs, metrics, styles=styles)
    lines: dict[str, list] = {metric: [] for metric in metrics}
    for i, ref in enumerate(row.references):
        ax = fig.axes[metrics.index(ref.metric)]
        colour = f"C{len(runs) + i}"
        label = f"{ref.source.split(' ')[0]} ({ref.steps:,} steps)"
        lines[ref.metric].append(ax.axhline(ref.value, color=colour, linestyle="--", linewidth=1, label=label))
        if ref.std:
            ax.axhspan(ref.value - ref.std, ref.value + ref.std, color=colour, alpha=0.1, linewidth=0)
        ax.axvline(ref.steps, color=colour, linestyle=":", linewidth=1)
    if peer:  # EPyMARL run here (epymarl_runs): the mean over its seeds, ± their std
        at = across_seeds(peer["curves"])
        steps = list(at)
        mean = [statistics.mean(at[step]) for step in steps]
        n = len(peer["curves"])
        label = f"EPyMARL here ({n} seed{'s' if n > 1 else ''})"
        lines[EVAL].append(fig.axes[0].plot(steps, mean, color="k", linestyle="--", linewidth=1, label=label)[0])
        if n > 1:
            std = [statistics.stdev(at[step]) for step in steps]
            low = [m - sd for m, sd in zip(mean, std, strict=True)]
            high = [m + sd for m, sd in zip(mean, std, strict=True)]
            fig.axes[0].fill_between(steps, low, high, color="k", alpha=0.08, linewidth=0)
    for ax, metric in zip(fig.axes, metrics, strict=True):
        if lines[metric]:
            ax.legend(handles=lines[metric], loc="lower right", fontsize=8)  # the seeds: the figure's legend
        ax.set_title(wrap_title(f"{row.title}: {METRIC_NAMES[metric]}"), fontsize=10)
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}.png"
    fig.savefig(path, dpi=90)
    return path


def wrap_title(title: str) -> str:
    """A figure's title in lines that fit its width (one line ran past both edges and was cut)."""
    return "\n".join(textwrap.wrap(title, 50))


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def ref_cell(ref: Reference) -> str:
    """A reference's number on the page: value ± its source's std, and what it is measured on."""
    return f"{ref.value:g}{f' ± {ref.std:g}' if ref.std is not None else ''}{on(ref)}"


def on(ref: Reference) -> str:
    """The page's marker for a reference not measured on the evaluation return."""
    return "" if ref.metric == EVAL else " (training episodes)"


def epymarl_runs(row: Row) -> dict | None:
    """The row's EPyMARL runs made here (``row.epymarl``): its summary and each seed's test curve."""
    summary = kept_summary(row.epymarl) if row.epymarl else None
    if summary is None:
        return None
    return {"summary": summary, "curves": seed_curves(row.epymarl, summary)}


def by_machine(summary: dict) -> dict[str, list[dict]]:
    """A row's seeds grouped by the machine each ran on (rows resumed on another machine)."""
    groups: dict[str, list[dict]] = {}
    for seed in summary["seeds"]:
        groups.setdefault(seed_machine(seed, summary), []).append(seed)
    return groups


def wall_per_seed(summary: dict, name_machine: bool = False) -> str:
    """The mean wall time per seed, on each machine apart when the seeds ran on several, and with
    its machine's name where ``name_machine`` (a GPU row's: the CPU rows' machine is the page's)."""
    groups = by_machine(summary)
    walls = {machine: statistics.mean(s["wall_s"] for s in seeds) / 60 for machine, seeds in groups.items()}
    if len(walls) == 1:
        machine, wall = next(iter(walls.items()))
        return f"{wall:.1f} min" + (f" ({short_machine(machine)})" if name_machine else "")
    return "; ".join(f"{wall:.1f} min ({short_machine(machine)})" for machine, wall in walls.items())


def short_machine(machine: str) -> str:
    """'Intel(R) Xeon(R) Processor, 2 cores' -> 'Intel Xeon': a table cell's name of a machine."""
    return re.sub(r"\((R|TM)\)| Processor| CPU", "", machine.split(",")[0]).strip()


def machine_line(summary: dict) -> str:
    groups = by_machine(summary)
    if len(groups) == 1:
        return f"machine: {next(iter(groups))}, {summary['date']}"
    return (
        "machines: "
        + "; ".join(
            f"seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s['seed']) for s in seeds)}: {machine}"
            for machine, seeds in groups.items()
        )
        + f" (last seed {summary['date']})"
    )


def row_ranks(row: Row) -> int:
    """The ranks of each of a row's runs (its ``world_size`` key)."""
    return next((int(key.split("=")[1]) for key in row.keys if key.startswith("world_size=")), 1)


def jobs_note(summary: dict, ranks: int = 1) -> str:
    """How many seeds of a row shared the machine, where more than one did (``ranks``: each seed's)."""
    jobs = max(s.get("jobs", 1) for s in summary["seeds"])
    each = "one core each" if ranks == 1 else f"{ranks} ranks each"
    return f" (up to {jobs} seeds at once, {each})" if jobs > 1 else ""


def epymarl_lines(row: Row, peer: dict) -> tuple[str, list[str]]:
    """The table's reference cell and the details of a row's EPyMARL runs made here."""
    summary, d = peer["summary"], row.digits
    finals = mean_std([s["final"] / row.agents for s in summary["seeds"]], d)
    details = [
        f"- EPyMARL run here (commit `{summary['epymarl_commit'][:7]}`; {summary['epymarl_versions']}), its QMIX "
        f"defaults on the same protocol, the reference column: `{summary['command']}` (+ `seed=K`, in EPyMARL's tree; "
        f"`python benchmarks/results/run.py {row.epymarl} --epymarl DIR --epymarl-python PY` runs it); "
        f"{machine_line(summary)}; {wall_per_seed(summary)} per seed{jobs_note(summary)}; per seed (best / final "
        "test at step): "
        + "; ".join(
            f"seed {s['seed']}: {s['best'] / row.agents:.{d}f} / {s['final'] / row.agents:.{d}f} at {s['final_step']:,}"
            for s in summary["seeds"]
        )
    ]
    if len(peer["curves"]) > 1:
        paper = papoudakis_returns(per_agent(peer["curves"], row.agents))
        details.append(
            f"- EPyMARL's maximum returns here {paper['max_mean']:.{d}f} ± {paper['max_ci95']:.{d}f} (95 % CI, at "
            f"step {paper['max_step']:,}), average returns {paper['average_mean']:.{d}f} "
            f"± {paper['average_ci95']:.{d}f}"
        )
    last = sorted({s["final_step"] for s in summary["seeds"]})  # its last test: a little before t_max
    return f"EPyMARL run here: {finals} at {' / '.join(f'{step:,}' for step in last)}", details


def page() -> str:
    lines = [
        "# Results: published numbers, reproduced",
        "",
        "Each row trains ddprl with the command shown, one run per seed, and sets its evaluation",
        "return (the mean over the run's evaluation episodes, greedy actions) at the reference's",
        "step count beside the published number; a reference marked *training episodes* reports the",
        "return of the episodes played while training (sampled actions), and ddprl's number beside it",
        "is the mean of its training episodes' return over the last 5 % of the steps.",
        "`python benchmarks/results/run.py ROW --seeds 3`",
        "reruns a row; `--page` rebuilds this page from the runs kept in `benchmarks/results/runs/`",
        "(their gzipped `metrics.jsonl` files: `ddprl plot benchmarks/results/runs/ROW/seed*` redraws them).",
        "Mean ± standard deviation over seeds; a reference's ± is what its source reports.",
        "A QMIX row's reference, where it has run, is EPyMARL itself run here on the same task and",
        "protocol (its final test: mean ± standard deviation over its seeds).",
        "",
        "| row | reference | steps | ddprl at those steps | ddprl best | seeds | wall time per seed | curve |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details = []
    for name, row in ROWS.items():
        summary_path = RUNS / name / "summary.json"
        partial, lost = in_progress(name), in_progress(name, LOST)
        if not summary_path.exists() and (partial or lost):  # a long row whose seeds are all part-way
            image = draw(name, row).relative_to(PAGE.parent)
            best = max(
                (
                    (value, f"seed {s['seed']}{how}")
                    for seeds, how in ((partial, ""), (lost, ", lost"))
                    for s in seeds
                    for _, value in s["evals"]
                ),
                default=None,
            )
            best_cell = f"{best[0]:.{row.digits}f} so far ({best[1]})" if best else ""
            where = "; ".join(
                f"{len(seeds)} {what}, at " + " and ".join(f"{s['step']:,}" for s in seeds)
                for seeds, what in ((partial, "in progress"), (lost, "lost"))
                if seeds
            )
            for ref in row.references:
                lines.append(
                    f"| {row.title} | {ref_cell(ref)} "
                    f"| {ref.steps:,} | not reached: {where} | {best_cell} | 0 | | [png]({image}) |"
                )
            details += [
                f"### {row.title}",
                "",
                f"- command: `{row.command()}` (+ `seed=K`)",
                *([f"- reference: {'; '.join(r.source for r in row.references)}"] if row.references else []),
                *([progress_line(row, partial)] if partial else []),
                *([lost_line(row, lost)] if lost else []),
                *([f"- {row.note}"] if row.note else []),
                "",
                f"![{row.title}]({image})",
                "",
            ]
            continue
        if not summary_path.exists():
            for ref in row.references:
                lines.append(f"| {row.title} | {ref_cell(ref)} | {ref.steps:,} | not run yet | | | | |")
            if not row.references:
                lines.append(f"| {row.title} | not transcribed | | not run yet | | | | |")
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        peer = epymarl_runs(row)
        image = draw(name, row, peer).relative_to(PAGE.parent)
        wall = wall_per_seed(summary, name_machine=row.key("device") == "cuda")
        for i, ref in enumerate(row.references):
            ours = [s["at_reference"][i] for s in seeds if s["at_reference"][i] is not None]
            lines.append(
                f"| {row.title} | {ref_cell(ref)} "
                f"| {ref.steps:,} | {mean_std(ours)} | {mean_std([s['best'] for s in seeds])} "
                f"| {len(seeds)} | {wall} | [png]({image}) |"
            )
        per = row.agents  # returns on the page: divided by this
        paper = None
        if row.papoudakis and len(seeds) > 1:
            curves = seed_curves(name, summary)
            paper = papoudakis_returns(per_agent(curves, per))
        reference, peer_details = epymarl_lines(row, peer) if peer else ("not transcribed", [])
        if not row.references:  # ours at the end of the budget
            final = mean_std([s["final"] / per for s in seeds], row.digits)
            best = mean_std([s["best"] / per for s in seeds], row.digits)
            if paper:
                d = row.digits
                best = f"{paper['max_mean']:.{d}f} ± {paper['max_ci95']:.{d}f} (95 % CI) at {paper['max_step']:,}"
            lines.append(
                f"| {row.title} | {reference} | {seeds[0]['final_step']:,} | {final} | {best} "
                f"| {len(seeds)} | {wall} | [png]({image}) |"
            )
        details += [
            f"### {row.title}",
            "",
            f"- command: `{summary['command']}` (+ `seed=K`)",
            *([f"- reference: {'; '.join(r.source for r in row.references)}"] if row.references else []),
            f"- {machine_line(summary)}{jobs_note(summary, row_ranks(row))}",
            "- per seed (at each reference's steps, measured as it is / best evaluation / final evaluation "
            "at step): "
            + "; ".join(
                f"seed {s['seed']}: {' and '.join(fmt(v) for v in s['at_reference']) or '—'} "
                f"/ {s['best'] / per:.{row.digits}f} / {s['final'] / per:.{row.digits}f} at {s['final_step']:,}"
                for s in seeds
            ),
        ]
        if partial:
            details.append(progress_line(row, partial))
        if lost:
            details.append(lost_line(row, lost))
        if paper:
            d = row.digits
            details.append(
                f"- Papoudakis et al.'s measures over these {len(seeds)} seeds: maximum returns "
                f"{paper['max_mean']:.{d}f} ± {paper['max_ci95']:.{d}f} (mean ± 95 % confidence interval at step "
                f"{paper['max_step']:,}, the evaluation with the highest mean); average returns over all "
                f"evaluations {paper['average_mean']:.{d}f} ± {paper['average_ci95']:.{d}f}"
            )
        details += random_line(name, per, row.digits) + peer_details
        if row.note:
            details.append(f"- {row.note}")
        details += ["", f"![{row.title}]({image})", ""]
    peer_lines, peer_details = peer_section()
    return (
        "\n".join(lines + supervised_table() + peer_lines + not_yet() + ["", "## Rows", ""] + details + peer_details)
        + "\n"
    )


def progress_line(row: Row, partial: list[dict]) -> str:
    """The page's line for a long row's seeds still part-way (:func:`in_progress`)."""
    return (
        "- in progress (each seed as its last sitting left it, stopped with a checkpoint that `--resume` goes "
        "on from; a seed leaves this line for the results when it ends): " + "; ".join(how_far(row, s) for s in partial)
    )


def lost_line(row: Row, lost: list[dict]) -> str:
    """The page's line for a long row's attempts whose checkpoints were lost (:func:`set_aside_lost`)."""
    return (
        "- lost (a seed's earlier attempt, stopped with a checkpoint that went with the machine it was on: "
        "checkpoints and replay buffers are not committed, so the seed started again; what it measured is "
        "kept here and drawn, and counts for nothing above): " + "; ".join(how_far(row, s) for s in lost)
    )


def how_far(row: Row, seed: dict) -> str:
    """One part-way seed (:func:`in_progress`): its step, training time and evaluations so far."""
    evals = ", ".join(f"{value:.{row.digits}f} at {step:,}" for step, value in seed["evals"]) or "none yet"
    return (
        f"seed {seed['seed']} at {seed['step']:,} of {int(row.key('steps')):,} steps after "
        f"{seed['wall_s'] / 3600:.1f} h of training, evaluations: {evals}"
    )


def binned_mean(records: list[dict], key: str, width: float) -> dict[int, float]:
    """``{bin: mean}`` of ``key`` over the records whose step falls in each ``width``-step bin."""
    bins: dict[int, list[float]] = {}
    for r in records:
        if key in r:
            bins.setdefault(int((r["step"] - 1) // width), []).append(r[key])
    return {b: statistics.mean(values) for b, values in bins.items()}


def draw_peer(name: str, row: PeerRow, seeds: list[int], steps: int) -> Path:
    """The training episodes' return of every run of a peer row against steps: one colour per
    implementation, each seed's curve faint, and bold the mean over seeds of 2 %-of-the-steps
    bins (one update's value is the mean of the few episodes that ended in it: noisy)."""
    from ddprl.plot import figure, load_runs

    runs = load_runs([RUNS / name / f"{impl}-seed{seed}" for impl in row.impls for seed in seeds])
    fig = figure(runs, [TRAIN])
    ax = fig.axes[0]
    colours = {impl: f"C{i}" for i, impl in enumerate(IMPLS)}
    for line in ax.get_lines():  # labelled by run directory: <impl>-seed<K>
        line.set_color(colours[line.get_label().rsplit("-seed", 1)[0]])
        line.set_linewidth(0.6)
        line.set_alpha(0.35)
    fig.legends.clear()  # figure()'s legend names each run; one entry per implementation instead
    width = steps / 50
    handles = []
    for impl in row.impls:
        per_seed = [binned_mean(runs[f"{impl}-seed{seed}"], TRAIN, width) for seed in seeds]
        common = sorted(set.intersection(*(set(b) for b in per_seed)))
        mean = [statistics.mean(b[i] for b in per_seed) for i in common]
        handles += ax.plot([(i + 0.5) * width for i in common], mean, color=colours[impl], linewidth=2)
    ax.legend(handles, [IMPLS[impl] for impl in row.impls], loc="lower right", fontsize=8)
    ax.set_title(wrap_title(f"{row.title}: {METRIC_NAMES[TRAIN]}, {len(seeds)} seed(s) each"), fontsize=10)
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}.png"
    fig.savefig(path, dpi=90)
    return path


def across(seeds: list[dict], impl: str, key: str) -> list[float]:
    """``key`` of ``impl``'s run of every seed of a peer row's summary, where it has one."""
    return [s[impl][key] for s in seeds if impl in s and s[impl][key] is not None]


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def wall_cell(runs: list[dict]) -> str:
    """Mean end-to-end seconds per seed, with the compile and the training alone after it."""
    if not runs:  # an implementation the row does not run
        return "—"
    wall = statistics.mean(r["wall_s"] for r in runs)
    compiles = [r["compile_s"] for r in runs if r["compile_s"] is not None]
    compiled = f"compile {seconds(statistics.mean(compiles))}, " if compiles else ""
    return f"{seconds(wall)} ({compiled}training {seconds(statistics.mean(r['train_s'] for r in runs))})"


def peer_section() -> tuple[list[str], list[str]]:
    """The page's section on the peer rows (a table and the shared notes), and their details."""
    lines = [
        "",
        "## The JAX engine against PureJaxRL, on the same CPU",
        "",
        f"PureJaxRL's PPO ({PUREJAXRL_REPO}, `purejaxrl/ppo.py` at commit `{PUREJAXRL_COMMIT[:7]}`), run",
        "here beside ddprl's two engines (the JAX one on one device, as PureJaxRL, and on two), every",
        "run with PureJaxRL's own hyperparameters (ppo.py's configuration; for MinAtar, its",
        "`examples/brax_minatar.ipynb`'s, which calls the same code). Each cell is the mean return",
        "of the training episodes (sampled actions) over the last 5 % of the steps, what PureJaxRL",
        "logs; ddprl's greedy evaluation (10 episodes) at the end is its own column. Wall time per",
        "seed: end to end (start-up, compile, evaluations), then the compile and the training alone.",
        "One run at a time, same machine, nothing else running.",
        "",
        f"| task | steps | {' | '.join(IMPLS.values())} | ddprl greedy eval at the end: {' / '.join(DDPRL_IMPLS)} "
        f"| wall time per seed: {' / '.join(IMPLS)} | seeds | curve |",
        "|---|---|" + "---|" * len(IMPLS) + "---|---|---|---|",
    ]
    details = []
    for name, row in PEER_ROWS.items():
        summary_path = RUNS / name / "summary.json"
        if not summary_path.exists():
            steps = ddprl_ppo_keys(row.config())[1].split("=")[1]
            lines.append(
                f"| {row.title} | {int(steps):,} | not run yet (`run.py {name} --purejaxrl DIR`) "
                + "| " * (len(IMPLS) + 3)
                + "|"
            )
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        image = draw_peer(name, row, [s["seed"] for s in seeds], summary["steps"]).relative_to(PAGE.parent)
        cells = [mean_std(across(seeds, impl, "train_return")) for impl in IMPLS]
        evals = " / ".join(mean_std(across(seeds, impl, "eval_return")) for impl in DDPRL_IMPLS)
        walls = " / ".join(wall_cell([s[impl] for s in seeds if impl in s]) for impl in IMPLS)
        lines.append(
            f"| {row.title} | {summary['steps']:,} | {' | '.join(cells)} | {evals} | {walls} | {len(seeds)} "
            f"| [png]({image}) |"
        )
        pj = summary["purejaxrl"]
        details += [
            f"### {row.title}: ddprl against PureJaxRL",
            "",
            f"- PureJaxRL: `{PUREJAXRL_CLONE}`, then `python benchmarks/results/run.py {name} --purejaxrl purejaxrl "
            f"--purejaxrl-python purejaxrl-venv/bin/python --seeds {len(seeds)}`; its environment: "
            + ", ".join(f"{k} {v}" for k, v in pj["versions"].items()),
            f"- PureJaxRL's config: `{json.dumps(pj['config'])}`",
            *(f"- ddprl {impl}: `{command}` (+ `seed=K`)" for impl, command in summary["commands"].items()),
            f"- machine: {summary['machine']}, {summary['date']}",
            "- per seed (training episodes' return over the last 5 % / greedy eval at the end / time: "
            "end to end, compile, training): "
            + "; ".join(
                f"seed {s['seed']}: "
                + ", ".join(
                    f"{impl} {fmt(s[impl]['train_return'])} / {fmt(s[impl]['eval_return'])} / "
                    f"{seconds(s[impl]['wall_s'])}, {seconds(s[impl]['compile_s'])}, {seconds(s[impl]['train_s'])}"
                    for impl in row.impls
                )
                for s in seeds
            ),
        ]
        if row.note:
            details.append(f"- {row.note}")
        details += ["", f"![{row.title}: ddprl against PureJaxRL]({image})", ""]
    lines += [
        "",
        "To run them (PureJaxRL from its own checkout, in an environment of its own; ddprl never imports it):",
        "",
        "```bash",
        *PUREJAXRL_CLONE.split(" && "),
        PUREJAXRL_VENV.split(" && ")[0],
        PUREJAXRL_VENV.split(" && ")[1],
        *(
            f"python benchmarks/results/run.py {name} --purejaxrl purejaxrl "
            "--purejaxrl-python purejaxrl-venv/bin/python --seeds 3"
            for name in PEER_ROWS
        ),
        "```",
        "",
        "How PureJaxRL's configuration maps onto ddprl's keys: `num_envs` is global (NUM_ENVS), `batch_size`",
        "is per device or rank (PureJaxRL's minibatch, NUM_ENVS x NUM_STEPS / NUM_MINIBATCHES, on one device,",
        f"its 1/{PEER_DEVICES} on {PEER_DEVICES}: the same minibatch and optimizer steps per epoch), `steps` is",
        "PureJaxRL's whole updates (for ppo.py's 500k, 976 updates of 512 steps: it rounds down, ddprl would",
        "round up), `activation` is its ACTIVATION, and the other keys carry its values (`ddprl_ppo_keys` in",
        "benchmarks/results/run.py).",
        "What still differs:",
        "",
        *(f"- {note}" for note in PEER_NOTES),
    ]
    return lines, details


def supervised_table() -> list[str]:
    lines = [
        "",
        "## Supervised Trainer against baselines on the same split",
        "",
        "The test metric on the same held-out 15 % (ddprl's `split_seed=0` split, features or targets",
        "standardised with the training statistics). ddprl trains on 70 % and keeps the epoch of its",
        "best validation loss; the baselines are fitted on the 85 % of train + validation. On",
        "graph_energy the metric is the mean squared error of the standardised energy (lower is",
        "better; the training mean scores about 1); its linear baseline is told the form of the answer",
        "(a sum of pair terms, so it regresses on the count of pairs at each distance), which the",
        "GNN has to learn from positions: a bound more than a peer.",
        "",
        "| task | command | ddprl, test | baselines, same split | seeds | wall time per seed |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in SUPERVISED_ROWS.items():
        summary_path = RUNS / name / "summary.json"
        if not summary_path.exists():
            lines.append(f"| {row.title} | `{row.command()}` | not run yet | | | |")
            continue
        summary = json.loads(summary_path.read_text())
        seeds = summary["seeds"]
        ours = [s[f"test/{row.metric}"] for s in seeds]
        theirs = "; ".join(
            f"{model}: {mean_std([s['baselines'][model] for s in seeds], digits=4)}" for model in seeds[0]["baselines"]
        )
        wall = statistics.mean(s["wall_s"] for s in seeds)
        lines.append(
            f"| {row.title} | `{summary['command']}` | {row.metric} {mean_std(ours, digits=4)} | {theirs} "
            f"| {len(seeds)} "
            f"| {wall:.0f} s ({summary['machine']}) |"
        )
    return lines


def main() -> int:
    global RUNS, PAGE, IMAGES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row", nargs="?", choices=sorted({**ROWS, **SUPERVISED_ROWS, **PEER_ROWS, **EPYMARL_ROWS}))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--resume", action="store_true", help="keep the seeds this row's summary already holds, train the others"
    )
    parser.add_argument("--page", action="store_true", help="rebuild docs/results.md from the kept runs")
    parser.add_argument("--list", action="store_true")
    parser.add_argument(
        "--random", action="store_true", help="QMIX rows: the return of random actions on the row's task (random.json)"
    )
    parser.add_argument("--purejaxrl", type=Path, help=f"peer rows: a checkout of PureJaxRL ({PUREJAXRL_CLONE})")
    parser.add_argument(
        "--purejaxrl-python",
        default=os.environ.get("PUREJAXRL_PYTHON"),
        help="peer rows: the python of PureJaxRL's own environment (default: $PUREJAXRL_PYTHON)",
    )
    parser.add_argument("--epymarl", type=Path, help="epymarl-* rows: an EPyMARL tree (github.com/uoe-agents/epymarl)")
    parser.add_argument(
        "--epymarl-python",
        default=os.environ.get("EPYMARL_PYTHON"),
        help="epymarl-* rows: the python of EPyMARL's own environment (default: $EPYMARL_PYTHON)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="seeds run at once (EPyMARL and one-rank ddprl rows run on one core each)"
    )
    parser.add_argument("--steps", type=int, help="peer rows: a shorter budget (PureJaxRL's TOTAL_TIMESTEPS)")
    parser.add_argument(
        "--runs", type=Path, help="keep the runs, the page and its PNGs under this folder instead (smoke runs)"
    )
    args = parser.parse_args()
    if args.runs:
        RUNS, PAGE, IMAGES = args.runs, args.runs / "results.md", args.runs / "results"
    if args.list:
        for name, row in {**ROWS, **SUPERVISED_ROWS, **PEER_ROWS}.items():
            print(f"{name:34s} {row.command()}")
        for name, task in EPYMARL_ROWS.items():
            print(f"{name:34s} {epymarl_row_command(task)}  (EPyMARL's tree)")
        return 0
    if args.random:
        if args.row not in QMIX_TASKS:
            parser.error(f"--random: one of the QMIX rows {', '.join(QMIX_TASKS)}")
        print(json.dumps(random_baseline(args.row)))
    elif args.row in PEER_ROWS:
        if args.purejaxrl is None:
            parser.error(f"{args.row} runs PureJaxRL too: --purejaxrl DIR, a checkout made with {PUREJAXRL_CLONE}")
        run_peer_row(args.row, args.seeds, args.purejaxrl.resolve(), args.purejaxrl_python, args.steps, args.resume)
    elif args.row in EPYMARL_ROWS:
        if args.epymarl is None:
            from qmix_speed import EPYMARL_VENV

            parser.error(f"{args.row} runs EPyMARL: --epymarl DIR, an EPyMARL tree ({EPYMARL_VENV})")
        run_epymarl_row(args.row, args.seeds, args.epymarl.resolve(), args.epymarl_python, args.resume, args.jobs)
    elif args.steps:
        parser.error("--steps shortens peer rows only")
    elif args.row:
        pass_on_stop_signals()
        run_row(args.row, args.seeds, args.resume, args.jobs)
    if args.page or args.row:
        PAGE.write_text(page())
        print(f"wrote {PAGE}")
    if not (args.row or args.page):
        parser.error("name a ROW, or --page, or --list")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
