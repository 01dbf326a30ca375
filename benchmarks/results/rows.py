"""The results page's rows: each one's ``ddprl train`` keys, the published reference it is set against
(the citation, the number, what its ± is over) and a short note. Nothing here runs anything."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

EVAL = "eval/return_mean"  # greedy actions, separate evaluation episodes
WON = "eval/won_mean"  # the share of greedy evaluation battles won (SMAX)
TRAIN = "train/episode_return"  # the training episodes' return (sampled actions), as CleanRL and PureJaxRL log it


@dataclass(frozen=True)
class Reference:
    source: str  # the citation, as the page's reference list gives it
    value: float  # ± std at steps, measured as ddprl's metric is
    std: float | None
    steps: int
    metric: str = EVAL
    who: str = ""  # the table's short name of the source, the task version it ran, and what its ± is over
    task: str = ""
    spread: str = ""
    seeds: tuple[float, ...] = ()  # each seed's value, where the source gives them


@dataclass(frozen=True)
class Row:
    keys: tuple[str, ...]  # `ddprl train` keys; seed= and run_dir= are added per run
    references: tuple[Reference, ...] = ()
    digits: int = 1
    agents: int = 1  # the page divides returns by this (MPE: per agent, as Papoudakis et al.)
    epymarl: str = ""  # the EPyMARL row run here on the same task: a QMIX row's reference
    jaxmarl: str = ""  # the JaxMARL row run here on the same battle: a QMIX-on-SMAX row's reference (win rate)
    cleanrl: str = ""  # the CleanRL row run here on the same task, beside the row's published references
    long: bool = False  # hours per seed: trained in WORK across sittings, from checkpoints
    dataset: str = ""  # a supervised row's task, against baselines fitted on the same split (baselines.py) ...
    metric: str = ""  # ... on the test metric it logs as test/<metric>

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys)

    def key(self, name: str) -> str | None:
        return dict(key.split("=", 1) for key in self.keys).get(name)


ZOO = "SB3 zoo `benchmark.md` (rl-baselines3-zoo, one trained agent; ± over its evaluation episodes)"
CLEANRL = (
    "CleanRL `docs/benchmark/ppo_continuous_action.md` (Open RL Benchmark tag pr-424, {task}-v4, "
    "1M steps; the training episodes' return at the end of training, ± over 3 seeds)"
)


def zoo(task: str, value: float, std: float, extra: str = "", who: str = "SB3 zoo", steps=1_000_000) -> Reference:
    return Reference(ZOO + extra, value, std, steps, EVAL, who, task, "std over episodes of 1 agent")


def cleanrl(task: str, value: float, std: float) -> Reference:
    source = CLEANRL.format(task=task)
    return Reference(source, value, std, 1_000_000, TRAIN, "CleanRL pr-424", f"{task}-v4", "std over 3 seeds")


def row(keys: str, *references: Reference, **fields) -> Row:
    return Row(tuple(keys.split()), references, **fields)


# CleanRL itself, run here (Row.cleanrl): its unchanged script from a checkout, in an environment of its own
# (CleanRL pins gymnasium 0.29.1 and mujoco <= 2.3.3), one process per seed on one core.
CLEANRL_REPO = "https://github.com/vwxyzjn/cleanrl"
CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"
CLEANRL_CLONE = f"git clone {CLEANRL_REPO} cleanrl && git -C cleanrl checkout {CLEANRL_COMMIT}"
CLEANRL_SCRIPT = "cleanrl/ppo_continuous_action.py"
CLEANRL_VENV = (
    "python3 -m venv cleanrl-venv && cleanrl-venv/bin/pip install torch==2.13.0 'gymnasium==0.29.1' "
    "'mujoco==2.3.3' 'numpy<2' tyro tensorboard imageio"
)
# row: (its --env-id, its --total-timesteps)
CLEANRL_ROWS = {
    f"cleanrl-{task.lower()}-v4": (f"{task}-v4", 1_000_000)
    for task in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid")
}
LUNAR = zoo("LunarLander-v2", 242.119, 31.823, " (LunarLander-v2: the same task before Gymnasium's fixes)")
HUMANOID, TUNED = cleanrl("Humanoid", 716.11, 49.08), "SB3 zoo (tuned keys)"
GSDE = (", with gSDE exploration", "SB3 zoo (gSDE)")
MUJOCO = "world_size=2 n_steps=1024 batch_size=32"  # CleanRL's rollout and minibatch on 2 ranks
# ddprl's Humanoid-v5 preset on Humanoid-v4 (no preset of its own): the keys where it differs from the defaults
HUMANOID_V4 = "task=Humanoid-v4 world_size=2 num_envs=2 n_steps=1024 batch_size=32 steps=1000000 lr=0.0003 "
HUMANOID_V4 += "norm_obs=true norm_reward=true eval_freq=50000"
# rl-baselines3-zoo hyperparams/ppo.yml's HalfCheetah-v3 entry (vf_coef doubled: ddprl's value loss is half SB3's)
ZOO_HALFCHEETAH = "task=HalfCheetah-v5 world_size=1 num_envs=1 n_steps=512 batch_size=64 epochs=20 lr=2.0633e-05 "
ZOO_HALFCHEETAH += "anneal_lr=false gamma=0.98 gae_lambda=0.92 clip_coef=0.1 clip_vloss=false vf_coef=1.16192 "
ZOO_HALFCHEETAH += "ent_coef=0.000401762 max_grad_norm=0.8 norm_obs=true norm_reward=true hidden_sizes=[256,256] "
ZOO_HALFCHEETAH += "activation=relu log_std_init=-2 ortho_init=false"

V4_MB = f"{HUMANOID_V4} norm_adv=minibatch"
ROWS: dict[str, Row] = {
    "ppo-cartpole": row(
        "task=CartPole-v1 world_size=2 steps=100000 eval_freq=10000", zoo("CartPole-v1", 500, 0, steps=100_000)
    ),
    "ppo-acrobot": row("task=Acrobot-v1 world_size=2 steps=1000000", zoo("Acrobot-v1", -73.506, 18.201)),
    "ppo-pendulum": row(
        "task=Pendulum-v1 world_size=2 steps=100000 eval_freq=10000",
        zoo("Pendulum-v1", -172.225, 104.159, *GSDE, steps=100_000),
    ),
    "ppo-mountaincar": row(
        "task=MountainCarContinuous-v0 world_size=2 steps=20000 eval_freq=10000",
        zoo("MountainCarContinuous-v0", 88.343, 2.572, *GSDE, steps=20_000),
    ),
    "ppo-lunarlander": row("task=LunarLander-v3 world_size=2", LUNAR),
    "ppo-lunarlander-batch64-per-rank": row("task=LunarLander-v3 world_size=2 batch_size=64", LUNAR),
    "ppo-halfcheetah": row(
        f"task=HalfCheetah-v5 {MUJOCO}",
        cleanrl("HalfCheetah", 1442.64, 46.03),
        zoo("HalfCheetah-v3", 5819.099, 663.530, ", HalfCheetah-v3, tuned keys (not the paper's)", TUNED),
    ),
    "ppo-halfcheetah-zoo": row(
        ZOO_HALFCHEETAH,
        zoo("HalfCheetah-v3", 5819.099, 663.53, ", HalfCheetah-v3, the keys this row runs", "SB3 zoo (these keys)"),
    ),
    "ppo-hopper": row(
        f"task=Hopper-v5 {MUJOCO}",
        cleanrl("Hopper", 2382.86, 271.74),
        zoo("Hopper-v3", 2410.435, 10.026, ", Hopper-v3, tuned keys", TUNED),
    ),
    "ppo-walker2d": row(
        f"task=Walker2d-v5 {MUJOCO}",
        cleanrl("Walker2d", 2287.95, 571.78),
        zoo("Walker2d-v3", 3478.798, 821.708, ", Walker2d-v3, tuned keys", TUNED),
    ),
    "ppo-ant": row(
        f"task=Ant-v5 {MUJOCO}",
        zoo("Ant-v3", 1327.158, 451.577, ", Ant-v3, SB3's default keys", "SB3 zoo (SB3 defaults)"),
    ),
    "ppo-ant-v4": row(
        f"task=Ant-v4 {MUJOCO}",
        zoo("Ant-v3", 1327.158, 451.577, ", Ant-v3, SB3's default keys", "SB3 zoo (SB3 defaults)"),
        cleanrl="cleanrl-ant-v4",
    ),
    "ppo-halfcheetah-v4": row(
        f"task=HalfCheetah-v4 {MUJOCO}", cleanrl("HalfCheetah", 1442.64, 46.03), cleanrl="cleanrl-halfcheetah-v4"
    ),
    "ppo-hopper-v4": row(f"task=Hopper-v4 {MUJOCO}", cleanrl("Hopper", 2382.86, 271.74), cleanrl="cleanrl-hopper-v4"),
    "ppo-walker2d-v4": row(
        f"task=Walker2d-v4 {MUJOCO}", cleanrl("Walker2d", 2287.95, 571.78), cleanrl="cleanrl-walker2d-v4"
    ),
    "ppo-humanoid": row(f"task=Humanoid-v5 {MUJOCO}", HUMANOID),
    "ppo-humanoid-v4": row(HUMANOID_V4, HUMANOID, cleanrl="cleanrl-humanoid-v4"),
    "ppo-humanoid-v4-mbadv": row(V4_MB, HUMANOID, cleanrl="cleanrl-humanoid-v4"),
    "ppo-humanoid-mbadv": row(f"task=Humanoid-v5 {MUJOCO} norm_adv=minibatch", HUMANOID),
}
# Atari at 10M agent steps (40M frames), the preset being CleanRL's ppo_atari_envpool.py settings, against its
# published numbers (docs/benchmark/ppo_atari_envpool.md at CLEANRL_COMMIT; 3 seeds, one GPU each, as here)
CLEANRL_ATARI = (
    "CleanRL `docs/benchmark/ppo_atari_envpool.md` (Open RL Benchmark tag pr-424, ppo_atari_envpool.py on {task}, "
    "10M steps; the training episodes' raw game score at the end of training, ± over 3 seeds)"
)
ATARI_TASKS = {"Pong-v5": (20.45, 0.09), "Breakout-v5": (211.24, 151.84), "BeamRider-v5": (2501.85, 210.52)}
for task, (value, std) in ATARI_TASKS.items():
    source = CLEANRL_ATARI.format(task=task)
    ref = Reference(source, value, std, 10_000_000, TRAIN, "CleanRL pr-424", task, "std over 3 seeds")
    ROWS[f"ppo-atari-{task.removesuffix('-v5').lower()}"] = row(f"task={task} world_size=1 device=cuda", ref, long=True)
# Atari on the CPU, many sittings a seed: 2 ranks of one core each, the preset's 8 games split 4 a rank (the same
# global keys as the GPU row), a checkpoint every 250k steps to go on from; compiled updates (1.13x the steps/s).
# The precision is named, not the preset's auto, so the command says what trained: Pong's seeds in fp32 (its first
# seed trained before the preset took auto), the others in bf16 (~1.4x the steps/s on these CPUs' bf16 units).
ATARI_CPU = "task={} world_size=2 device=cpu cpu_bind=cores checkpoint_freq=250000 compile=true precision={}"
ATARI_CPU_PRECISION = {"Pong-v5": "fp32", "Breakout-v5": "bf16", "BeamRider-v5": "bf16"}
for task in ATARI_TASKS:
    name = f"ppo-atari-{task.removesuffix('-v5').lower()}"
    command = ATARI_CPU.format(task, ATARI_CPU_PRECISION[task])
    ROWS[f"{name}-cpu"] = row(command, ROWS[name].references[0], long=True)

# the page compares rows a, b pooled against c, d ("a+b:c+d", Welch's t-test)
VERSUS = {
    "ppo-humanoid-v4-mbadv": "ppo-humanoid-v4-mbadv:ppo-humanoid-v4",
    "ppo-humanoid-mbadv": "ppo-humanoid-mbadv+ppo-humanoid-v4-mbadv:ppo-humanoid+ppo-humanoid-v4",
}
NOTES = {  # at most ~3 lines each on the page
    "ppo-pendulum": "The zoo's agent explores with gSDE, which ddprl's PPO does not have; ddprl's preset normalises "
    "observations and rewards instead.",
    "ppo-mountaincar": "The zoo's agent explores with gSDE and a small initial action noise; ddprl's preset keeps "
    "the default Gaussian (std 1) with the zoo's discount and normalisation.",
    "ppo-lunarlander": "The preset gives the zoo's minibatch of 64 as minibatches=256 of the 16 x 1024 rollout "
    "(batch_size 32 on 2 ranks): the zoo's optimizer steps on any world size.",
    "ppo-lunarlander-batch64-per-rank": "The preset before it gave minibatches: 64 per rank, so minibatches of 128 "
    "on 2 ranks and half the zoo's optimizer steps per epoch; this gap is why presets give minibatches.",
    "ppo-halfcheetah": "ddprl runs the PPO paper's values, as CleanRL does; the zoo's number comes from its own tuned "
    "keys (network, learning rate, clipping, epochs): a reference for the task. `ppo-halfcheetah-zoo` runs them.",
    "ppo-halfcheetah-zoo": "rl-baselines3-zoo hyperparams/ppo.yml's HalfCheetah-v3 entry as ddprl keys (vf_coef "
    "doubled: ddprl's value loss is half SB3's). Still different: SB3 normalises advantages per minibatch.",
    "ppo-halfcheetah-v4": "The v5 preset on CleanRL's task version (the `-v4` rows). The zoo's v3 tasks cannot be "
    "run here: Gymnasium moved them to gymnasium-robotics, where they need mujoco-py and MuJoCo 2.1's binaries, "
    "which no package index serves.",
    "ppo-ant": "Below the zoo on v5, and the task version accounts for it: the same keys on Ant-v4, without "
    "the contact forces v5 observes and charges, end above the zoo (`ppo-ant-v4`). The zoo runs SB3's defaults "
    "(constant lr, no value clipping, per-minibatch advantages) on Ant-v3, one agent.",
    "ppo-ant-v4": "Ant-v4 leaves the contact forces out of the observation and the reward by default; Ant-v3 read "
    "them as zero under MuJoCo 2.0 and later (openai/gym issue 1541): of the versions that run here, the closest "
    "to the zoo's. Ant-v5 observes and charges them.",
    "ppo-humanoid": "CleanRL ran Humanoid-v4; v5 charges the contact cost v4 had dropped. The Humanoid-v4 rows part "
    "the task version from ddprl's algorithm: on v4 ddprl ends as low, beside CleanRL's own script run here.",
    "ppo-humanoid-v4": "The v5 preset's keys on CleanRL's task version; CleanRL run here also ends below its "
    "published number. Still different: ddprl normalises advantages and observations once per rollout and "
    "bootstraps the 1,000-step time limit, where CleanRL ends the episode.",
    "ppo-humanoid-v4-mbadv": "Advantages normalised per minibatch of 64 (32 per rank), as CleanRL does.",
    "ppo-humanoid-mbadv": "Per-minibatch advantages on v5; the MuJoCo preset keeps `norm_adv=true` until the other "
    "MuJoCo rows have been run so. Both task versions:",
    "ppo-atari-pong": "The three GPU rows are not run yet: no GPU has been available to run them. On a 2-core CPU "
    "machine the `-cpu` rows' 10M-step seed takes 2.5-2.8 h in bf16 on AMX (1,000-1,100 steps/s, benchmarks.md, "
    "Atari), 6 to 13 h in fp32 (221 to 495 steps/s).",
    "ppo-atari-pong-cpu": "Pong on 2 CPU cores in fp32, a seed over several sittings (seed 1: 7.5 h of training at "
    "~490 steps/s), a seed in progress resumable from its checkpoint (21 MB) in runs/. Seed 1 ends 0.45 points a "
    "game under CleanRL's mean, whose ± 0.09 is over 3 seeds at Pong's ceiling of 21; one seed gives no verdict.",
    "ppo-atari-breakout-cpu": "Breakout on 2 CPU cores in bf16 (fp32 weights; the preset's `precision=auto` on these "
    "CPUs), kept and resumed across sittings as `ppo-atari-pong-cpu` (seed 1: 4.1 h of training in five stretches). "
    "Seed 1 ends above CleanRL's mean and inside its 3 seeds' spread (± 151.8); one seed gives no verdict.",
    "ppo-atari-beamrider-cpu": "BeamRider on 2 CPU cores in bf16 (fp32 weights; the preset's `precision=auto` on these "
    "CPUs), kept and resumed across sittings as `ppo-atari-pong-cpu` (seed 1: 4.2 h of training in three stretches; "
    "from 1.7M steps on with denormal floats flushed to zero, as every rank now runs). Seed 1 ends 58 points above "
    "CleanRL's mean, inside its 3 seeds' spread (± 210.5); one seed gives no verdict.",
    "qmix-lbf-2s-8x8-2p-2f-coop": "Seed 3 of each ddprl row drops at its final test (to 0.43 and 0.24, from "
    "best tests of 0.66 and 0.56); the `-epymarl` row's seeds 4 and 5 end at 0.565 and 0.635.",
    "qmix-lbf-10x10-3p-3f": "Most food needs two or three agents loading it together. Neither library learns much "
    "in 2.05M steps: both end below random actions; ddprl's training episodes returned 0.11 to 0.13 in the first "
    "10k steps (epsilon near 1), 0.07 to 0.09 at the end.",
    "qmix-rware-tiny-2ag": "rware pays only for delivering a requested shelf, in episodes of 500 steps: neither "
    "library's greedy policy learns to deliver in 2.05M steps, and random actions score higher.",
    "qmix-mpe-simple-spread-bootstrap": "Time limits bootstrapped, ddprl's QMIX default elsewhere: QMIX diverged "
    "(mean Q of the taken actions 21 to 24 at 110k steps, 3,373 to 17,781 at 1.2M, beyond any return the task "
    "pays). ddprl's MPE preset treats the time limit as terminal (docs/qmix.md).",
    "qmix-smax-3m": "Both libraries' win rates swing by 0.3 to 0.4 between tests of 32 battles, JaxMARL's seed 2 "
    "from 0.41 at 172k to 0.05 at the end. A seed took ddprl 4 to 8 min and JaxMARL 27 to 29 min on 2 cores.",
    "qmix-smax-5m_vs_6m": "Five marines against six: at any test ddprl's greedy policies won 0 to 4 of 32 battles, 0 "
    "at the last; JaxMARL's won at most 0.006 of its test battles. Final greedy returns: ddprl 0.61 to 0.65, "
    "JaxMARL 0.53 to 0.58. JaxMARL's configuration is for 10M steps (its TOTAL_TIMESTEPS), 20 times this budget.",
    "tdmpc2-reacher-easy": "Reward only while the fingertip is in the target: seed 2's final 733.2 ± 423.7 (± std "
    "over its 4 episodes) is three episodes near 975 and one near 0, a target never reached.",
    "tdmpc2-finger-spin": "Seed 3's evaluations from 30k on (712.5 to 732.5, ± about 415 over 4 episodes) are three "
    "episodes near 950 and one at 0, the spinner never turned; seeds 1 and 2 show no such episode from 30k on.",
    "jax-acrobot": "ppo.py's CartPole configuration (PureJaxRL publishes none for Acrobot).",
    "jax-breakout": "Runs climb off plateaus at steps and to heights that differ by seed (final returns 22 to 92): six "
    "seeds do not order the three.",
    "jax-spaceinvaders": "From about 2M steps ddprl's greedy episodes reach gymnax's 1,000-step limit, where the two "
    "treat a time limit apart (the section notes); whether that makes the gap is not tested.",
}

# QMIX on EPyMARL's protocol (Papoudakis et al. 2021), against EPyMARL's own QMIX run here (EPYMARL_ROWS)
QMIX_STEPS, QMIX_EVAL_FREQ, QMIX_EVAL_EPISODES = 2_050_000, 50_000, 100
QMIX_TASKS = {  # row: (task, agents the page divides the team return by)
    "qmix-lbf-8x8-2p-2f-coop": ("Foraging-8x8-2p-2f-coop-v3", 1),
    "qmix-lbf-2s-8x8-2p-2f-coop": ("Foraging-2s-8x8-2p-2f-coop-v3", 1),
    "qmix-lbf-10x10-3p-3f": ("Foraging-10x10-3p-3f-v3", 1),
    "qmix-rware-tiny-2ag": ("rware-tiny-2ag-v2", 1),
    "qmix-mpe-simple-spread": ("simple_spread_v3", 3),
}
EPYMARL_ROWS = {"epymarl-" + row.removeprefix("qmix-"): task for row, (task, _) in QMIX_TASKS.items()}
# -epymarl: EPyMARL's QMIX settings on ddprl (raw mixer states, time limits not bootstrapped, 32 episodes an update)
VARIANTS = {"": "", "-epymarl": "batch_size=16 standardise_state=false bootstrap_truncated=false"}
for name, (task, agents) in QMIX_TASKS.items():
    for suffix, extra in {**VARIANTS, **({"-bootstrap": "bootstrap_truncated=true"} if agents > 1 else {})}.items():
        keys, epymarl = f"algo=qmix task={task} world_size=2 {extra}", "epymarl-" + name.removeprefix("qmix-")
        ROWS[name + suffix] = row(keys, digits=2, agents=agents, epymarl=epymarl)

# QMIX on SMAX battles against JaxMARL's own QMIX run here (JAXMARL_ROWS): its baselines/QLearning/qmix_rnn.py with
# its ql_rnn_smax configuration, at this budget and with 32 greedy test battles, as ddprl evaluates
JAXMARL_REPO, JAXMARL_COMMIT = "https://github.com/FLAIROx/JaxMARL", "c793d095618c6d3edfb5632802348f57b70a4b94"
JAXMARL_CLONE = f"git clone {JAXMARL_REPO} jaxmarl && git -C jaxmarl checkout {JAXMARL_COMMIT}"
JAXMARL_VENV = (
    "python3.11 -m venv jaxmarl-venv && jaxmarl-venv/bin/pip install jax==0.10.2 jaxmarl==0.2.0 flashbax "
    "hydra-core omegaconf wandb six"
)
SMAX_STEPS, SMAX_MAPS = 500_000, ("3m", "2s3z", "5m_vs_6m")
JAXMARL_QMIX = dict(TOTAL_TIMESTEPS=SMAX_STEPS, TEST_NUM_ENVS=32)  # and MAP_NAME, SEED (one seed a program)
JAXMARL_ROWS = {f"jaxmarl-smax-{name}": name for name in SMAX_MAPS}
for name in SMAX_MAPS:
    keys = f"algo=qmix task=smax/{name} world_size=2 steps={SMAX_STEPS} eval_freq=50000 eval_episodes=32"
    # three digits: with two, a win rate of a few battles in a thousand prints as 0.00 beside a nonzero gap
    ROWS[f"qmix-smax-{name}"] = row(keys, digits=3, jaxmarl=f"jaxmarl-smax-{name}")
# OMAGD's staged training on a battle where sight matters: every unit's sight 9 -> 6 (58 % of the units alive are
# out of an agent's sight in random play, 33 % at 9): QMIX on the sight-limited observation, on it with a graph
# reconstructer's fill-in (stages 1-2 trained once, kept in STAGES), and on the full observation (the oracle)
SIGHT = "env_kwargs.unit_type_sight_ranges=[6,6,6,6,6,6]"
STAGES = "benchmarks/results/runs/qmix-smax-3m-sight6-stages"
STAGE_COMMANDS = {  # as the kept stages ran, on 2 ranks (stage 2 with a small predictor: see docs/qmix.md)
    "tokenizer": f"ddprl train algo=qmix task=smax/3m {SIGHT} world_size=2 stage=tokenizer pretrain_episodes=2000 "
    "epochs=8",
    "mask_predictor": f"ddprl train algo=qmix task=smax/3m {SIGHT} world_size=2 stage=mask_predictor "
    f"init_from={STAGES}/tokenizer/best.pt pretrain_episodes=2000 epochs=30 d_model=64 n_heads=4 n_layers=2 "
    "ffn_dim=256",
}
RECONSTRUCTION_ROWS = {  # row: what its QMIX sees
    "qmix-smax-3m-sight6": ("sight-limited", ""),
    "qmix-smax-3m-sight6-reconstruct": ("reconstructed", f"reconstruct=true init_from={STAGES}/mask_predictor/best.pt"),
    "qmix-smax-3m-sight6-full": ("full observation (oracle)", "full_obs=true"),
}
for name, (_, extra) in RECONSTRUCTION_ROWS.items():
    keys = f"algo=qmix task=smax/3m {SIGHT} world_size=2 steps={SMAX_STEPS} eval_freq=50000 eval_episodes=32 {extra}"
    ROWS[name] = row(keys, digits=3)
# the QMIX rows whose random-action floor `run.py ROW --random` measures: (task, agents the return is divided by);
# SMAX's team reward is shared, not summed over agents, and its floor also counts battles won
RANDOM_TASKS = QMIX_TASKS | {f"qmix-smax-{name}": (f"smax/{name}", 1) for name in SMAX_MAPS}

# TD-MPC2 at 100k environment steps (50k agent steps, action repeat 2) against the official per-task CSVs:
# CPU rows at model_size 1 (4 evaluation episodes), GPU rows at the CSVs' 5 (`bash benchmarks/gpu_session.sh`)
TDMPC2_CSV = (
    "official TD-MPC2 per-task CSV (github.com/nicklashansen/tdmpc2 `results/tdmpc2/{task}.csv`, the default "
    "5M-parameter model; mean ± std of its 3 seeds, {seeds}, at {env_steps:,} environment steps = {steps:,} agent "
    "steps)"
)
TDMPC2_TASKS = {  # the CSV's 3 seeds at 100k environment steps
    "cartpole-swingup": (789.8, 867.9, 860.5),
    "reacher-easy": (972.8, 977.9, 859.9),
    "finger-spin": (985.6, 937.3, 919.6),
}
# in this order: a kept run's command is matched to its row's as a string
TDMPC2_KEYS = "algo=tdmpc2 task={} model_size={} world_size=1 steps={} eval_freq=10000 eval_episodes={} "
TDMPC2_KEYS += "checkpoint_freq={} checkpoint_buffer=true"


def tdmpc2_reference(task: str, published: tuple[float, ...], steps: int) -> Reference:
    seeds = " / ".join(f"{v:g}" for v in published)
    source = TDMPC2_CSV.format(task=task, seeds=seeds, env_steps=2 * steps, steps=steps)  # action repeat 2
    mean, std = round(statistics.mean(published), 1), round(statistics.stdev(published), 1)
    return Reference(source, mean, std, steps, EVAL, "TD-MPC2 CSV (5M)", task, "std over 3 seeds", published)


for task, published in TDMPC2_TASKS.items():
    ref = tdmpc2_reference(task, published, 50_000)
    ROWS[f"tdmpc2-{task}"] = row(TDMPC2_KEYS.format(task, 1, 50000, 4, 2500), ref, long=True)
    gpu = TDMPC2_KEYS.format(task, "5 device=cuda compile=true", 50000, 10, 10000)
    ROWS[f"tdmpc2-{task}-gpu"] = row(gpu, ref, long=True)
# a harder task at twice the budget, GPU only: the CSV at e9f5932, 200k environment steps
WALKER_RUN = (767.8, 773.5, 800.2)
ROWS["tdmpc2-walker-run-gpu"] = row(
    TDMPC2_KEYS.format("walker-run", "5 device=cuda compile=true", 100000, 10, 10000),
    tdmpc2_reference("walker-run", WALKER_RUN, 100_000),
    long=True,
)


SUPERVISED_ROWS = {
    f"supervised-{name.replace('_', '-')}": row(f"algo=supervised task={name} world_size=2", dataset=name, metric=m)
    for name, m in (("digits", "accuracy"), ("breast_cancer", "accuracy"), ("graph_energy", "mse"))
}

# -- peer rows: ddprl's two engines beside PureJaxRL's PPO, all run here ---------------------------------
PUREJAXRL_REPO = "https://github.com/luchris429/purejaxrl"
PUREJAXRL_COMMIT = "31756b197773a52db763fdbe6d635e4b46522a73"
PUREJAXRL_CLONE = f"git clone {PUREJAXRL_REPO} purejaxrl && git -C purejaxrl checkout {PUREJAXRL_COMMIT}"
PUREJAXRL_VENV = (
    "python3.11 -m venv purejaxrl-venv && purejaxrl-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 "
    "gymnax==1.0.1 flax==0.12.8 distrax==0.1.9 tfp-nightly==0.26.0.dev20261027 optax==0.2.8 chex==0.1.92 "
    "brax==0.14.2 mujoco==3.17.0 mujoco-mjx==3.17.0 navix==0.7.4"
)
# purejaxrl/ppo.py's own configuration (its __main__; DEBUG off: a host callback per episode, not timed here)
PUREJAXRL_PPO = dict(LR=2.5e-4, NUM_ENVS=4, NUM_STEPS=128, TOTAL_TIMESTEPS=500_000, UPDATE_EPOCHS=4)
PUREJAXRL_PPO |= dict(NUM_MINIBATCHES=4, GAMMA=0.99, GAE_LAMBDA=0.95, CLIP_EPS=0.2, ENT_COEF=0.01, VF_COEF=0.5)
PUREJAXRL_PPO |= dict(MAX_GRAD_NORM=0.5, ACTIVATION="tanh", ANNEAL_LR=True, DEBUG=False)
# its examples/brax_minatar.ipynb (the same make_train, "briefly tuned" for MinAtar)
PUREJAXRL_MINATAR = {**PUREJAXRL_PPO, "LR": 5e-3, "NUM_ENVS": 64, "TOTAL_TIMESTEPS": 10_000_000}
PUREJAXRL_MINATAR |= {"NUM_MINIBATCHES": 8, "ACTIVATION": "relu"}
PEER_DEVICES = 2  # ddprl's JAX engine on 2 simulated CPU devices, its torch engine on 2 ranks
IMPLS = {"purejaxrl": "PureJaxRL", "jax1": "jax, 1 device", "jax": "jax, 2 devices", "torch": "torch, 2 ranks"}
DEVICES = {"purejaxrl": 1, "jax1": 1, "jax": PEER_DEVICES, "torch": PEER_DEVICES}


def ddprl_ppo_keys(config: dict, devices: int = PEER_DEVICES, eval_freq: int = 50_000) -> tuple[str, ...]:
    """PureJaxRL's PPO ``config`` as ddprl keys on ``devices`` devices or ranks: ``num_envs`` is global and
    ``batch_size`` per device (PureJaxRL's minibatch is ``batch_size`` x devices); ``steps`` is its whole
    updates (it rounds TOTAL_TIMESTEPS down, ddprl would round up), so both anneal lr over as many."""
    c, rollout = config, config["NUM_ENVS"] * config["NUM_STEPS"]
    minibatch, rest = divmod(rollout, c["NUM_MINIBATCHES"])
    if rest or minibatch % devices or c["NUM_ENVS"] % devices:
        raise ValueError(f"{config}: the envs and minibatches do not split over {devices} devices")
    return tuple(  # one optimizer step per minibatch; value loss clipped as ppo.py's; separate actor and critic
        f"algo=ppo steps={int(c['TOTAL_TIMESTEPS']) // rollout * rollout} num_envs={c['NUM_ENVS']} "
        f"n_steps={c['NUM_STEPS']} batch_size={minibatch // devices} sync_freq=1 epochs={c['UPDATE_EPOCHS']} "
        f"lr={c['LR']} anneal_lr={str(c['ANNEAL_LR']).lower()} gamma={c['GAMMA']} gae_lambda={c['GAE_LAMBDA']} "
        f"clip_coef={c['CLIP_EPS']} clip_vloss=true vf_coef={c['VF_COEF']} ent_coef={c['ENT_COEF']} "
        f"max_grad_norm={c['MAX_GRAD_NORM']} target_kl=null norm_adv=true norm_obs=false norm_reward=false "
        f"policy=mlp hidden_sizes=[64,64] activation={c['ACTIVATION']} eval_freq={eval_freq} eval_episodes=10 "
        "eval_deterministic=true".split()
    )


@dataclass(frozen=True)
class PeerRow:
    """PureJaxRL's PPO and ddprl's engines, each run here with PureJaxRL's hyperparameters (``base``)."""

    task: str  # gymnax id: PureJaxRL's ENV_NAME and ddprl jax's task=gymnax/<id>
    torch_task: str | None  # the same task in Gymnasium, for ddprl's torch engine (None: gymnax only)
    base: tuple[tuple[str, object], ...] = tuple(PUREJAXRL_PPO.items())
    eval_freq: int = 50_000

    @property
    def impls(self) -> tuple[str, ...]:  # no torch run of a gymnax-only task
        return tuple(impl for impl in IMPLS if impl != "torch" or self.torch_task)

    @property
    def ddprl_impls(self) -> tuple[str, ...]:
        return self.impls[1:]

    def config(self, steps: int | None = None) -> dict:  # steps: a shorter TOTAL_TIMESTEPS (a smoke run)
        return {**dict(self.base), "ENV_NAME": self.task, **({"TOTAL_TIMESTEPS": steps} if steps else {})}

    def keys(self, impl: str, steps: int | None = None) -> tuple[str, ...]:
        n = DEVICES[impl]
        engine = f"engine=jax devices={n} task=gymnax/{self.task}" if impl != "torch" else None
        engine = engine or f"engine=torch world_size={n} task={self.torch_task}"
        return tuple(engine.split()) + ddprl_ppo_keys(self.config(steps), n, self.eval_freq)

    def command(self) -> str:
        return "ddprl train " + " ".join(self.keys("jax"))


MINATAR = tuple(PUREJAXRL_MINATAR.items())
PEER_ROWS: dict[str, PeerRow] = {
    "jax-cartpole": PeerRow("CartPole-v1", "CartPole-v1"),
    "jax-acrobot": PeerRow("Acrobot-v1", "Acrobot-v1"),
    "jax-breakout": PeerRow("Breakout-MinAtar", None, MINATAR, 500_000),
    "jax-spaceinvaders": PeerRow("SpaceInvaders-MinAtar", None, MINATAR, 500_000),
}
