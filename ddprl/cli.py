"""``ddprl`` command line: train, eval, play, plot, doctor, keys.

    ddprl train [--config-name NAME] [key=value ...]
    ddprl eval checkpoint=PATH|RUN_DIR [episodes=10] [device=cpu] [seed=N]
    ddprl play checkpoint=PATH|RUN_DIR [fps=10] [episodes=1] [video=out.gif] [device=cpu] [seed=N]
    ddprl doctor [world_size=auto] [device=auto] [backend=auto] [engine=jax devices=N]
    ddprl plot RUN_DIR [RUN_DIR ...] [out=PATH] [keys=a,b] [x=step|wall_time]
    ddprl keys [algo=NAME] [engine=jax] [task=NAME]

Algorithms come from ``ddprl.registry``: nothing here knows one by name.

Exit codes: 0 done; 2 bad input (one line ``ddprl: error: ...``); 1 failure at run time; 74 a
file of the run did not fit on its disk (one line; the same command with resume=auto goes on once
there is room); 75 preempted (a signal stopped the job after a checkpoint: the same command with
resume=auto goes on).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import TYPE_CHECKING, Any

from ddprl import registry
from ddprl.errors import DISK_FULL_EXIT_CODE, DiskFull, UsageError, first_process, say_once
from ddprl.prepare import key_values, launcher_overrides, prepare_train, saved_config

if TYPE_CHECKING:
    from ddprl.config.schema import RLConfig
    from ddprl.runtime import Runtime

Row = tuple[str, str, str, str]  # (key, type, default, help) of a command's key
KEY_COLUMNS = ("key", "type", "default", "from", "help")  # of training's keys: `ddprl keys`, `ddprl train --help`

# The keys of the commands other than train, for their --help. cmd_eval and cmd_play parse
# their own; tests/test_help.py checks that these tables name exactly the keys they accept.
COMMAND_KEYS: dict[str, list[Row]] = {
    "eval": [
        ("checkpoint", "path", "(required)", "a checkpoint file, or a run directory (its best.pt, else latest.pt)"),
        ("episodes", "int", "10", "episodes to roll out"),
        ("device", "str", "auto", "auto | cpu | cuda"),
        ("seed", "int", "the run's", "seed of the evaluation environments"),
        ("video", "path", "''", "also write one episode to this file (.gif, .mp4)"),
        ("deterministic", "bool", "the run's", "most likely actions (false: sampled), for algorithms with both"),
    ],
    "eval algo=supervised": [
        ("checkpoint", "path", "(required)", "a supervised checkpoint: prints its metrics on one split"),
        ("split", "str", "test", "test | val | train"),
        ("device", "str", "auto", "auto | cpu | cuda"),
        ("batch_size", "int", "the run's", "samples per evaluation batch"),
        ("task", "str", "the run's", "module:function of the task (required for a task of your own code)"),
    ],
    "play": [
        ("checkpoint", "path", "(required)", "a checkpoint file, or a run directory (its best.pt, else latest.pt)"),
        ("episodes", "int", "1", "episodes to play"),
        ("fps", "float", "10", "frames per second in the terminal"),
        ("video", "path", "''", "write the episodes to this file (.gif, .mp4) instead of the terminal"),
        ("device", "str", "cpu", "cpu | cuda"),
        ("seed", "int", "the run's", "seed of the environment (episode i: seed + i)"),
        ("deterministic", "bool", "the run's", "most likely actions (false: sampled), for algorithms with both"),
    ],
    "doctor": [
        (
            "world_size",
            "int | auto",
            "auto",
            "processes to start (auto: one per visible GPU, else 2; engine=jax: one per machine)",
        ),
        ("device", "str", "auto", "auto | cpu | cuda"),
        ("backend", "str", "auto", "auto | nccl | gloo"),
        ("host_collectives", "str", "auto", "auto | shm | gloo: CPU ranks of one machine (as in train)"),
        ("master_port", "str", "auto", "port of the rendezvous (auto: a free one)"),
        ("size_mb", "float", "64", "size of the all_reduce whose bandwidth is measured, in MB"),
        ("dist_timeout", "float", "300", "seconds before a stuck collective fails"),
        ("engine", "str", "torch", "torch | jax"),
        ("devices", "int | auto", "auto", "engine=jax: JAX devices per process"),
    ],
    "plot": [
        ("RUN_DIR", "path", "(required)", "one or more run directories (each holds metrics.jsonl or metrics.jsonl.gz)"),
        ("out", "path", "RUN_DIR/curves.png", "the picture to write: .png, .pdf or .svg (default: beside the runs)"),
        (
            "keys",
            "list",
            "headline + losses",
            "metrics to draw, e.g. keys=eval/return_mean,train/loss (default: return, fps, then every train/*loss*)",
        ),
        ("x", "str", "step", "step (global agent steps) | wall_time (cumulative over resumes)"),
    ],
    "keys": [
        ("algo", "str", "ppo", "the algorithm whose keys to list (without: the algorithms, then ppo's keys)"),
        ("engine", "str", "torch", "torch | jax"),
        ("task", "str", "the algo's", "show the defaults this task gives (task files in ddprl/config/task/)"),
    ],
}


def cmd_train(args: argparse.Namespace) -> int:
    from ddprl.checkpoint import forget_checkpoint
    from ddprl.runlock import run_dir_held
    from ddprl.runtime import runs_in_this_process

    if "stage=pipeline" in args.overrides:
        from ddprl.algos.qmix.pipeline import run_pipeline

        return run_pipeline(args.overrides, args.config_name)
    cfg = prepare_train(args.overrides, args.config_name)
    if not runs_in_this_process(cfg):
        forget_checkpoint()  # the ranks read it themselves; don't hold it here meanwhile
    algorithm = registry.get(cfg.algo, cfg.engine)
    with run_dir_held(cfg) as cfg:  # one job per run directory
        algorithm.launch_fn()(algorithm.train_fn(), cfg)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ddprl.checkpoint import load_checkpoint
    from ddprl.config import load_config
    from ddprl.runtime import launch

    paths = [a.split("=", 1)[1] for a in args.overrides if a.startswith("checkpoint=")]
    if not paths:
        raise UsageError("eval: give checkpoint=PATH")
    path = _checkpoint_file(paths[-1])
    # The file, not the run directory, from here on (an algorithm's own evaluator reads it again).
    overrides = [a for a in args.overrides if not a.startswith("checkpoint=")] + [f"checkpoint={path}"]
    ckpt = load_checkpoint(path)
    algorithm = registry.get(ckpt.get("algo"), _engine_of(ckpt))  # a UsageError naming the known ones
    evaluator = algorithm.checkpoint_evaluator()
    if evaluator is not None:  # no policy to roll out: the algorithm evaluates itself
        return evaluator(ckpt, overrides)
    kv = key_values(
        overrides,
        {"checkpoint": str, "episodes": int, "device": str, "seed": int, "video": str, "deterministic": boolean},
        "eval",
    )
    if kv.get("episodes", 10) < 1:
        raise UsageError("eval: episodes must be >= 1")
    if "video" in kv:
        from ddprl.video import check_video_path, headless_rendering

        check_video_path(kv["video"])
        headless_rendering()  # before the ranks start: they inherit it
    saved = saved_config(ckpt["config"])
    # One process: a checkpoint from any number of ranks (and machines) evaluates here.
    extra = [
        "world_size=1",
        "nnodes=1",
        "progress=false",
        f"device={kv.get('device', 'auto')}",
        f"eval_episodes={kv.get('episodes', 10)}",
    ]
    if not algorithm.has_key("eval_episodes"):
        raise UsageError(f"eval: algo={ckpt['algo']} has no evaluation episodes")
    if "seed" in kv:
        extra.append(f"seed={kv['seed']}")
    extra += _deterministic_override(kv, ckpt, "eval")
    cfg = load_config(extra, resumed=saved)
    launch(functools.partial(_eval_rank, ckpt=ckpt, video=kv.get("video")), cfg)
    return 0


def _eval_rank(rt: Runtime, cfg: RLConfig, ckpt: dict[str, Any], video: str | None) -> None:
    from tqdm import tqdm

    from ddprl.evaluate import evaluate

    actor = registry.get(cfg.algo, cfg.engine).actor_loader()(cfg, ckpt["state"], rt.device)
    if video:  # before the episodes, which can take minutes: a video that cannot be drawn is refused first
        from ddprl.video import check_frames

        check_frames(actor, cfg.seed)
    # Episodes can take minutes (TD-MPC2 plans every step): a terminal sees them come.
    bar = tqdm(
        total=cfg.eval_episodes,
        desc="evaluating",
        unit="episode",
        file=sys.stderr,
        leave=False,
        disable=not (rt.is_main and sys.stderr.isatty()),
    )

    def progress(done: int, episodes: int) -> None:
        bar.update(done - bar.n)

    result = evaluate(rt, actor.make_env, actor.act, cfg.eval_episodes, cfg.seed, actor.extra_keys, progress)
    bar.close()
    if rt.is_main:  # the numbers first: a video that fails while it is written does not take them away
        extras = " ".join(
            f"{k}={v:.4g}" for k, v in result.items() if k not in ("return_mean", "return_std", "episodes")
        )
        print(extras, flush=True)
        print(
            f"return_mean={result['return_mean']:.4f} return_std={result['return_std']:.4f} "
            f"episodes={int(result['episodes'])}",
            flush=True,
        )
    if video:
        from ddprl.video import record_video

        record_video(actor, video, seed=cfg.seed)


def cmd_play(args: argparse.Namespace) -> int:
    import torch

    from ddprl.checkpoint import load_checkpoint
    from ddprl.config import load_config

    kv = key_values(
        args.overrides,
        {
            "checkpoint": str,
            "episodes": int,
            "fps": float,
            "video": str,
            "device": str,
            "seed": int,
            "deterministic": boolean,
        },
        "play",
    )
    if "checkpoint" not in kv:
        raise UsageError("play: give checkpoint=PATH")
    device = kv.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"play: device={device!r} is not cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("play: device=cuda but no CUDA device is visible")
    from ddprl.video import check_video_path, headless_rendering

    if "video" in kv:
        check_video_path(kv["video"])
    headless_rendering()  # before an env library is imported: making the actor imports them
    ckpt = load_checkpoint(_checkpoint_file(kv["checkpoint"]))
    saved = saved_config(ckpt["config"])
    cfg = load_config(
        ["world_size=1", f"device={device}", "progress=false"] + _deterministic_override(kv, ckpt, "play"),
        resumed=saved,
    )
    seed = kv.get("seed", cfg.seed)
    # One process, one device: a checkpoint from N ranks plays here.
    actor = registry.get(cfg.algo, cfg.engine).actor_loader()(cfg, ckpt["state"], torch.device(device))
    if "video" in kv:
        from ddprl.video import record_video

        episodes = kv.get("episodes", 1)
        for episode in range(episodes):
            path = kv["video"] if episodes == 1 else _numbered(kv["video"], episode)
            label = f"episode {episode + 1}/{episodes}" if episodes > 1 else ""
            print(f"wrote {record_video(actor, path, seed=seed + episode, fps=kv.get('fps'), label=label)}", flush=True)
    else:
        from ddprl.play import play_terminal

        play_terminal(actor, kv.get("episodes", 1), kv.get("fps", 10.0), seed)
    return 0


def boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(text)


def _deterministic_override(kv: dict[str, Any], ckpt: dict[str, Any], command: str) -> list[str]:
    """``deterministic=BOOL`` on eval/play: most likely vs sampled actions (algorithms that have both)."""
    if "deterministic" not in kv:
        return []
    if not registry.get(ckpt["algo"], _engine_of(ckpt)).has_key("eval_deterministic"):
        raise UsageError(
            f"{command}: deterministic= applies to algorithms with sampled and most likely actions; "
            f"{ckpt['algo']} evaluates without exploration noise"
        )
    return [f"eval_deterministic={str(kv['deterministic']).lower()}"]


def _engine_of(ckpt: dict[str, Any]) -> str:
    return str(ckpt.get("config", {}).get("engine", registry.DEFAULT_ENGINE))


def _checkpoint_file(path: str) -> Any:
    """checkpoint=PATH of eval and play: a file, or a run directory (its best.pt, else latest.pt)."""
    from pathlib import Path

    from ddprl.checkpoint import checkpoint_in

    file = checkpoint_in(path)
    if file != Path(path):
        print(f"ddprl: checkpoint {file}", file=sys.stderr, flush=True)
    return file


def _numbered(path: str, i: int) -> str:
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}-{i + 1}{p.suffix}"))


def cmd_doctor(args: argparse.Namespace) -> int:
    from ddprl.config import load_config
    from ddprl.runtime import resolved_config

    kv = key_values(
        args.overrides,
        {
            "world_size": str,
            "device": str,
            "backend": str,
            "host_collectives": str,
            "master_port": str,
            "size_mb": float,
            "dist_timeout": float,
            "engine": str,
            "devices": str,
        },
        "doctor",
    )
    size_mb = kv.pop("size_mb", 64.0)
    if "devices" in kv and kv.get("engine") != "jax":
        raise UsageError("doctor: devices= is a key of engine=jax (the torch engine has one device per rank)")
    cfg = resolved_config(load_config(launcher_overrides([f"{k}={v}" for k, v in kv.items()])))
    if cfg.engine == "jax":
        from ddprl.jax.runtime import doctor as jax_doctor
        from ddprl.jax.runtime import launch as jax_launch

        jax_launch(functools.partial(jax_doctor, size_mb=size_mb), cfg)
        return 0
    from ddprl.doctor import describe_machine, doctor
    from ddprl.runtime import launch

    print(describe_machine(cfg), flush=True)
    launch(functools.partial(doctor, size_mb=size_mb), cfg)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    kv = key_values(args.overrides, {"algo": str, "engine": str, "task": str}, "keys")
    title, rows, preset = algo_keys(kv)  # first: bad input prints nothing but its one line
    if "algo" not in kv:
        print("algorithms (ddprl keys algo=NAME [engine=jax] [task=NAME] lists the keys of one):")
        for algorithm in registry.declarations():
            print(f"  {algorithm.name:12s} {algorithm.engine:6s} {algorithm.description}")
        print()
    print(f"{title}; set them as `ddprl train key=value`:")
    if preset:
        print(f"(from: preset = a value of {preset}, whose comments give its source; keys you set win)")
    print(format_rows(rows, header=KEY_COLUMNS))
    return 0


def algo_keys(choice: dict[str, str]) -> tuple[str, list[tuple[str, ...]], str]:
    """A title, the (key, type, default, from, help) rows of the algorithm (and task) in
    ``choice``, resolved as ``ddprl train`` would (the algorithm's defaults, then the task's
    preset file), and that file's path ('' when the task has none)."""
    from ddprl.config import key_rows, load_config, task_preset_file

    cfg = load_config([f"{k}={v}" for k, v in choice.items() if k in ("algo", "engine", "task")])
    if "task" in choice:
        cfg.check_task()  # an unknown task is refused as `ddprl train` would, with near matches
    title = f"keys of algo={cfg.algo}" + (f" engine={cfg.engine}" if cfg.engine != registry.DEFAULT_ENGINE else "")
    if getattr(cfg, "task", None) is not None:
        title += f" with task={cfg.task}"
    origin = {"task preset": "preset", "command line": "given"}
    # a key another will derive (batch_size from minibatches) shows where it will come from
    derived = {plain: alt for plain, alt in getattr(cfg, "ALTERNATIVES", ()) if getattr(cfg, alt) is not None}
    rows = [
        (k, t, f"from {derived[k]}", origin.get(cfg.sources[derived[k]], "default"), h)
        if k in derived
        else (k, t, d, origin.get(cfg.sources[k], "default"), h)
        for k, t, d, h in key_rows(cfg)
    ]
    preset = task_preset_file(cfg.task) if "task preset" in cfg.sources.values() else None
    return title, rows, str(preset or "")


def format_rows(rows: list[tuple[str, ...]], header: tuple[str, ...] = (), indent: str = "") -> str:
    """Aligned columns, one key a line (so that ``ddprl keys | grep lr`` finds a key whole);
    the last column (help) is not padded, and a long default (a dict) pushes only its own help."""
    if header:
        rows = [header, *rows]
    columns = len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(columns - 1)]
    widths[2] = min(widths[2], 24)
    return "\n".join(
        (indent + "  ".join(f"{c:<{w}}" for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]).rstrip()
        for r in rows
    )


def cmd_plot(args: argparse.Namespace) -> int:
    from ddprl.plot import parse_plot_args, plot_runs

    run_dirs, options = parse_plot_args(args.overrides)
    print(f"wrote {plot_runs(run_dirs, **options)}", flush=True)
    return 0


COMMANDS = [
    (
        "eval",
        cmd_eval,
        "evaluate a checkpoint in one process",
        "Evaluate a checkpoint in one process: mean and std of the episode returns (a supervised "
        "checkpoint: its metrics on a split).",
    ),
    (
        "play",
        cmd_play,
        "watch an agent in the terminal or write a video (one process)",
        "Watch a checkpoint's agent in the terminal, or write its episodes to a video.",
    ),
    (
        "doctor",
        cmd_doctor,
        "check devices, backend, all_reduce and bandwidth",
        "Start the processes a job would, check all_reduce and measure its bandwidth.",
    ),
    (
        "plot",
        cmd_plot,
        "learning curves of run directories to a PNG",
        "Learning curves of one or more run directories, one subplot per metric, written to a picture.",
    ),
    (
        "keys",
        cmd_keys,
        "list config keys with their defaults, types and help",
        "The algorithms, then every key of one with its type, default and help.",
    ),
]


def build_parser(with_keys: bool = False, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``ddprl`` parser; ``with_keys``: each command's --help lists its keys (this resolves
    the configuration, so only when help is asked for)."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="ddprl",
        description="Reinforcement learning with PyTorch DDP.",
        epilog="ddprl COMMAND --help lists the keys of a command; ddprl keys [algo=NAME] those of training.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "train",
        help="train an agent (key=value overrides)",
        formatter_class=formatter,
        description="Train an agent: key=value sets a key (Hydra's grammar: hidden_sizes=[128,128], "
        "target_kl=null); bad keys and values stop the job before it starts.",
        epilog=train_epilog(argv or []) if with_keys else None,
    )
    p.add_argument(
        "--config-name",
        default=None,
        help="a shipped preset (snake_base, tdmpc2_ddp, ...) or a path to a YAML file of key: value",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any of the keys below")
    p.set_defaults(fn=cmd_train)
    for name, fn, help_, description in COMMANDS:
        epilog = None
        if with_keys:
            epilog = "keys:\n" + format_rows(COMMAND_KEYS[name], indent="  ")
            if name == "eval":
                epilog += "\n\nkeys of a supervised checkpoint:\n" + format_rows(
                    COMMAND_KEYS["eval algo=supervised"], indent="  "
                )
        p = sub.add_parser(name, help=help_, description=description, epilog=epilog, formatter_class=formatter)
        p.add_argument(
            "overrides",
            nargs="*",
            metavar="RUN_DIR | key=value" if name == "plot" else "key=value",
            help="the keys below",
        )
        p.set_defaults(fn=fn)
    return parser


def train_epilog(argv: list[str]) -> str:
    """The keys of the algorithm (and task) named on this command line, ppo's when none is."""
    choice = {k: v for k, _, v in (a.partition("=") for a in argv if "=" in a) if k in ("algo", "engine", "task")}
    try:
        title, rows, _ = algo_keys(choice)
    except UsageError as e:
        return f"keys: cannot list them ({e})"
    return (
        f"{title} (ddprl train algo=NAME [task=NAME] --help, or ddprl keys algo=NAME, for another's):\n"
        + format_rows(rows, header=KEY_COLUMNS, indent="  ")
    )


def report_usage_error(e: UsageError) -> None:
    """``ddprl: error: ...`` once per job. Under torchrun and srun every process runs this
    command line and finds the same bad input: the first process prints it, and each tells
    torchrun through its error file (:func:`ddprl.errors.say_once`)."""
    say_once(f"ddprl: error: {e}", first_process())


def entry() -> None:
    """The ``ddprl`` command: run ``main`` and end the process with its exit code."""
    from ddprl.runtime import exit_process

    try:
        code = main()
    except SystemExit as e:  # a rank's exit code raised through launch (2: bad input, 74: disk full, 75: preempted)
        code = e.code if isinstance(e.code, int) else 1
    exit_process(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(with_keys=any(a in ("-h", "--help") for a in argv), argv=argv)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as e:
        report_usage_error(e)
        return 2
    except DiskFull as e:  # met by this process itself (the run directory's lock file)
        say_once(f"ddprl: error: {e}", first_process())
        return DISK_FULL_EXIT_CODE
    except KeyboardInterrupt:
        print("ddprl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ddprl keys | head`: the reader left; no traceback, nothing more to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:  # a rank failed: say which, briefly; its traceback was logged by it
        from ddprl.runtime import RankFailed

        if isinstance(e, RankFailed):
            print(f"ddprl: {e}", file=sys.stderr, flush=True)
            return 1
        raise
