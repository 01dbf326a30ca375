"""The results page's rows: for each, the ``ddprl train`` command, the published reference it is
set against (source, number, steps, what is measured) and the notes that say where and why ddprl's
protocol differs. Adding a row is adding an entry here (``ROWS``, ``SUPERVISED_ROWS`` or
``PEER_ROWS``); nothing in this module runs anything."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .baselines import graph_baselines, sklearn_baselines

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
    cleanrl: str = ""  # the CLEANRL_ROWS row run here on the same task: a reference beside CleanRL's published one
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
# CleanRL itself, run here: its unchanged `ppo_continuous_action.py` on the task of the PPO rows that name
# it (Row.cleanrl), beside its published number: the same code on this machine, measured as ddprl is (the
# training episodes' return over the last 5 % of the steps). One process per seed, on one core.
CLEANRL_REPO = "https://github.com/vwxyzjn/cleanrl"
CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"  # 2026-04-20: the checkout its rows ran from
CLEANRL_CLONE = f"git clone {CLEANRL_REPO} cleanrl && git -C cleanrl checkout {CLEANRL_COMMIT}"
CLEANRL_SCRIPT = "cleanrl/ppo_continuous_action.py"
# The separate environment it runs in: CleanRL's pyproject pins gymnasium 0.29.1 and (its mujoco extra)
# mujoco <= 2.3.3; the script reads the vector env's `final_info`, which gymnasium 1.0 removed.
CLEANRL_VENV = (
    "python3 -m venv cleanrl-venv && cleanrl-venv/bin/pip install torch==2.13.0 'gymnasium==0.29.1' "
    "'mujoco==2.3.3' 'numpy<2' tyro tensorboard imageio"
)
CLEANRL_ROWS = {  # row: (its --env-id, its --total-timesteps)
    "cleanrl-humanoid-v4": ("Humanoid-v4", 1_000_000),
}
ZOO = "SB3 zoo `benchmark.md` (rl-baselines3-zoo, one trained agent; ± over its evaluation episodes)"
LUNARLANDER_ZOO = (
    Reference(ZOO + " (LunarLander-v2: the same task before Gymnasium's fixes)", 242.119, 31.823, 1_000_000),
)
# ddprl's Humanoid-v5 preset on Humanoid-v4 (no preset of its own): the keys where the preset
# differs from ddprl's defaults, given on the command line
HUMANOID_V4_KEYS = (
    "task=Humanoid-v4",
    "world_size=2",
    "num_envs=2",
    "n_steps=1024",
    "batch_size=32",
    "steps=1000000",
    "lr=0.0003",
    "norm_obs=true",
    "norm_reward=true",
    "eval_freq=50000",
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
        "0.58096. What still differs: SB3 normalises advantages in each minibatch, these runs over the rollout "
        "(ddprl's default; `norm_adv=minibatch`, added after them, does as SB3); "
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
        (Reference(ZOO + ", Ant-v3, SB3's default keys", 1327.158, 451.577, 1_000_000),),
        "CleanRL's table (tag pr-424) has no Ant. The zoo's Ant-v3 entry is not tuned: it is SB3's PPO defaults "
        "with VecNormalize (hyperparams/ppo.yml, `mujoco-defaults`), which are these keys but for a constant "
        "learning rate, no value clipping and advantages normalised per minibatch; its ± is over one agent's "
        "evaluation episodes, not over seeds, so it does not measure how far seeds spread. Ant-v5 pays the "
        "contact cost and observes the contact forces, as v3 did (v4 had "
        "dropped both by default), and pays the healthy reward only while the ant is healthy, where v3 paid it on "
        "the step that ended the episode too.",
    ),
    "ppo-humanoid": Row(
        "PPO, Humanoid-v5",
        ("task=Humanoid-v5", "world_size=2", "n_steps=1024", "batch_size=32"),
        (Reference(CLEANRL.format(task="Humanoid"), 716.11, 49.08, 1_000_000, TRAIN),),
        "CleanRL ran Humanoid-v4; v5 charges the contact cost that v4 had dropped and leaves out of the "
        "observation the parts that were always zero (Gymnasium's changelog for Humanoid-v5), so its returns run "
        "slightly lower for the same gait. Why this row ends below CleanRL's band: the two Humanoid-v4 rows "
        "below, with CleanRL itself run here beside them, and this row again with the advantages normalised "
        "per minibatch, the last of them.",
    ),
    "ppo-humanoid-v4": Row(
        "PPO, Humanoid-v4 (CleanRL's task version)",
        HUMANOID_V4_KEYS,
        (Reference(CLEANRL.format(task="Humanoid"), 716.11, 49.08, 1_000_000, TRAIN),),
        "The row above on Humanoid-v4, the version CleanRL ran, to part what v5 changes from what ddprl does: "
        "ddprl ships presets for the v5 tasks only, so the command gives the keys where the v5 preset differs from "
        "ddprl's defaults (`ddprl keys algo=ppo task=Humanoid-v5` shows them). "
        "On v5 the same gait scores lower: v5 charges the contact cost and pays no healthy reward on the step "
        "that ends the episode (with a random policy, 105.6 against v4's 113.8 over 20 episodes of 23 steps). "
        "Yet the two rows end alike (633.5 here, 631.7 on v5), both below CleanRL's published band: the "
        "version is not the cause. CleanRL's own script, run here on this task with the gymnasium and MuJoCo "
        "CleanRL pins (the line 'CleanRL run here'), ends at 679.0 ± 68.4 measured as ddprl is: ddprl's seeds "
        "lie within one of its standard deviations (Welch's t-test p = 0.41 over 3 seeds a side), its curve "
        "runs on ddprl's through training (the PNG, black), and its own seeds spread from 604.1 to 737.9, as "
        "wide as the gap to the published 716.1. What still differs from CleanRL's algorithm: ddprl "
        "normalises advantages once per rollout where CleanRL normalises each minibatch (the next row "
        "normalises them as CleanRL does), updates its observation statistics once per rollout where "
        "CleanRL's wrapper updates them every step, and bootstraps the value at the 1,000-step time limit "
        "where CleanRL ends the episode there as if it had terminated.",
        cleanrl="cleanrl-humanoid-v4",
    ),
    "ppo-humanoid-v4-mbadv": Row(
        "PPO, Humanoid-v4, advantages normalised per minibatch",
        (*HUMANOID_V4_KEYS, "norm_adv=minibatch"),
        (Reference(CLEANRL.format(task="Humanoid"), 716.11, 49.08, 1_000_000, TRAIN),),
        "The row above with the advantages normalised as CleanRL normalises them: in each optimizer step, "
        "with the mean and std of its minibatch (64 samples: 32 on each of the 2 ranks), where ddprl's "
        "default normalises them once per rollout. Within one standard deviation of CleanRL's published "
        "number and above CleanRL run here, 72.5 above the row above; with 3 seeds a side that difference is "
        "not resolved (Welch's t-test p = 0.19), so ddprl's default and its MuJoCo preset stay as they are "
        "(docs/ppo.md says how to choose).",
        cleanrl="cleanrl-humanoid-v4",
    ),
    "ppo-humanoid-mbadv": Row(
        "PPO, Humanoid-v5, advantages normalised per minibatch",
        ("task=Humanoid-v5", "world_size=2", "n_steps=1024", "batch_size=32", "norm_adv=minibatch"),
        (Reference(CLEANRL.format(task="Humanoid"), 716.11, 49.08, 1_000_000, TRAIN),),
        "The Humanoid-v5 row with the advantages normalised as CleanRL normalises them; the two rows above "
        "measure the same change on Humanoid-v4, CleanRL's task version, beside CleanRL run here. Within one "
        "standard deviation of CleanRL's published number, 51.9 above the Humanoid-v5 row (Welch's t-test "
        "p = 0.22 over 3 seeds a side). On both versions together (the same gait scores alike on them: the "
        "two per-rollout rows end at 633.5 and 631.7) it is 694.8 ± 51.4 per minibatch against 632.6 ± 36.9 "
        "per rollout over 6 seeds a side (Welch's p = 0.039, Mann-Whitney's 0.065): the evidence leans to "
        "per-minibatch normalisation on Humanoid. The MuJoCo preset keeps `norm_adv=true` until the other "
        "four MuJoCo rows have been run with `minibatch` as well: switching it now would leave them "
        "measuring a preset that is no longer ddprl's.",
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
    "ddprl runs model_size 1 (1M parameters) where the CSVs' runs have 5M: a 2-core CPU makes 2.1 to 2.5 agent "
    "steps/s a seed at model_size 1 (2.1 each with two seeds side by side, one a core), half that at 5, "
    "computing Mish with torch's own kernel. Since 2026-11-27 ddprl computes Mish on a CPU as "
    "x * tanh(softplus(x)) (equal to within 1e-6; 2.4 agent steps/s each, two seeds side by side, against "
    "2.1: docs/benchmarks.md), since 2026-11-28 from one exp (equal to within 1e-6; about 1.17 times the "
    "agent steps/s on an AMD EPYC of the first Zen generation, where a seed made 0.74 agent steps/s before and "
    "0.80 to 0.91 since, two seeds side by side: docs/benchmarks.md). "
    "Steps on the page and the curve are agent steps (action repeat 2). "
    "Evaluation: 4 episodes every 10,000 agent steps (the official code plays 10; each episode is 500 MPPI "
    "plans). A seed trains across sittings, checkpointed with its replay buffer every 2,500 agent steps; its "
    "wall time is the sum of its sittings' (each one's whole `ddprl train` command)."
)
TDMPC2_CPU_RUNS = {  # how each task's CPU seeds went, where the row's note has more to say than its numbers
    "reacher-easy": (
        " Its reward is 1 only while the fingertip is inside the target, so an episode in which the arm never "
        "reaches it scores about 0. Seed 2's last two evaluations, 723.0 ± 418.7 at 40,000 and 733.3 ± 423.7 "
        "at 50,000, and seed 1's at 20,000 and 30,000 (725.5 ± 411.9, 728.8 ± 420.9) can only be three "
        "episodes near 975 and one near 0 (4 episodes, returns at most 1,000: the lowest at most 2, 1, 17 "
        "and 2): one target in four never reached. With 4 episodes one such miss costs a quarter of the "
        "mean, with the official 10 a tenth; seeds 1 and 2 were scored on 4 episodes of which 3 were the "
        "same (the note above the table). Their final agents were not kept; from seed 3 on run.py keeps each "
        "seed's last checkpoint (benchmarks/results/work/ROW/final/, not committed), to evaluate over more "
        "episodes (`ddprl eval checkpoint=... episodes=N`). Seed 3 (its second attempt): Mish from one exp "
        "from agent step 4,590 on."
    ),
    "finger-spin": (
        " Seed 2 (its second attempt): Mish from one exp from agent step 4,618 on. Seed 3's evaluations from "
        "30,000 on, 727.5 ± 420.0, 732.5 ± 422.9 and 712.5 ± 411.4, can only be three episodes near 950 and "
        "one at 0 (4 episodes, returns at most 1,000: the lowest at most 0.0 each time). The reward counts the "
        "steps in which the spinner turns faster than 15 rad/s one way; in an episode at 0 it never moves. "
        "Seed 3's final agent (kept in benchmarks/results/work/, not committed), `ddprl eval "
        "checkpoint=... episodes=8`, the row's 4 evaluation starts and 4 more: 826.9 ± 312.8, one episode at "
        "0, the others up to 959; with training's exploration noise (`deterministic=false`) 807.5 ± 305.4, "
        "again one at 0: the noise does not free it. A trace of such an episode shows the agent bringing "
        "the finger to a curled pose in its first steps and holding it there with actions near 0 to the end, "
        "the spinner untouched: a standstill this seed's model plans itself into in one or two "
        "episodes in eight (which start fails changes with the planner's random numbers), which seeds 1 and 2 "
        "never showed at their evaluations from 30,000 on (means 924 to 989, "
        "standard deviations at most 18). Over its 8 episodes seed 3 would set the row at 930.1 ± 89.6; the "
        "row keeps the protocol's 4."
    ),
    "cartpole-swingup": (
        " Mish computed the faster way: seeds 1 and 2 from agent steps 22,405 and 22,382 on, seed 3 (not its lost "
        "attempt) throughout. The lost attempts of seeds 1 and 2 began before sittings were timed so: their first "
        "four and three sittings' times are estimated from their logs' timestamps (to about a minute each)."
    ),
}
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


def tdmpc2_keys(
    task: str, model_size: int, eval_episodes: int, checkpoint_freq: int, device: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """A TD-MPC2 row's keys: 50k agent steps on one rank, evaluated every 10k, checkpointed with its
    replay buffer (in this order: a kept run's command is matched to its row's as a string)."""
    return (
        "algo=tdmpc2",
        f"task={task}",
        f"model_size={model_size}",
        *device,
        "world_size=1",
        "steps=50000",
        "eval_freq=10000",
        f"eval_episodes={eval_episodes}",
        f"checkpoint_freq={checkpoint_freq}",
        "checkpoint_buffer=true",
    )


for task, published in TDMPC2_TASKS.items():
    reference = Reference(
        TDMPC2_CSV.format(task=task, seeds=" / ".join(f"{v:g}" for v in published)),
        round(statistics.mean(published), 1),
        round(statistics.stdev(published), 1),
        50_000,
    )
    ROWS[f"tdmpc2-{task}"] = Row(
        f"TD-MPC2, {task}, model_size 1 (agent steps: half the environment steps)",
        tdmpc2_keys(task, model_size=1, eval_episodes=4, checkpoint_freq=2500),
        (reference,),
        TDMPC2_NOTE + TDMPC2_CPU_RUNS.get(task, ""),
        long=True,
    )
    ROWS[f"tdmpc2-{task}-gpu"] = Row(
        f"TD-MPC2, {task}, model_size 5, one GPU (agent steps: half the environment steps)",
        tdmpc2_keys(
            task, model_size=5, eval_episodes=10, checkpoint_freq=10000, device=("device=cuda", "compile=true")
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
    "Advantages: PureJaxRL normalises them in each minibatch (its loss function), these ddprl runs "
    "once over the whole rollout of every device (`norm_adv=true`, ddprl's default); ddprl's "
    "`norm_adv=minibatch`, added after these runs, normalises them as PureJaxRL does.",
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
