"""``ddprl`` command line: train, eval, doctor, keys.

    ddprl train [--config-name NAME] [key=value ...]
    ddprl eval checkpoint=PATH [episodes=10] [device=cpu] [seed=N]
    ddprl play checkpoint=PATH [fps=10] [episodes=1] [video=out.gif] [device=cpu] [seed=N]
    ddprl doctor [world_size=auto] [device=auto] [backend=auto] [engine=jax devices=N]
    ddprl plot RUN_DIR [RUN_DIR ...] [out=curves.png] [keys=a,b] [x=step|wall_time]
    ddprl keys [algo=NAME]

Algorithms come from ``ddprl.registry``: nothing here knows one by name.

Exit codes: 0 done; 2 bad input (one line ``ddprl: error: ...``); 1 failure at run time; 75
preempted (a signal stopped the job after a checkpoint: the same command with resume=auto goes on).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from typing import Any, Callable

from ddprl import registry
from ddprl.errors import UsageError

# Settings of the interrupted job that must not carry over into a resumed one.
NOT_RESUMED = ("master_port", "master_addr", "node_rank", "resume", "run_dir")


def _key_values(args: list[str], allowed: dict[str, Callable[[str], Any]], command: str) -> dict[str, Any]:
    """Parse ``key=value`` arguments of the small commands (eval, doctor)."""
    import difflib

    values: dict[str, Any] = {}
    for arg in args:
        if "=" not in arg:
            raise UsageError(f"{command}: expected key=value, got {arg!r}")
        key, value = arg.split("=", 1)
        if key not in allowed:
            near = difflib.get_close_matches(key, list(allowed), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise UsageError(f"{command}: unknown key {key!r}{hint}; keys: {', '.join(allowed)}")
        try:
            values[key] = allowed[key](value)
        except ValueError:
            raise UsageError(f"{command}: {key}={value!r} is not a valid {allowed[key].__name__}") from None
    return values


def _launcher_overrides(overrides: list[str]) -> list[str]:
    """Under torchrun/srun the launcher fixes world_size: take it (or refuse a contradiction)."""
    from ddprl.runtime import detect_launcher

    launcher = detect_launcher()
    if launcher == "spawn":
        return overrides
    actual = int(os.environ["WORLD_SIZE"] if launcher == "torchrun" else os.environ["SLURM_NTASKS"])
    for o in overrides:
        if o.startswith("world_size=") and o.split("=", 1)[1] != str(actual):
            raise UsageError(f"{o} contradicts the {launcher} launcher's world size {actual}; drop world_size=")
    return [o for o in overrides if not o.startswith("world_size=")] + [f"world_size={actual}"]


def prepare_train(overrides: list[str], config_name: str | None, values: dict[str, Any] | None = None,
                  prepare_hook: bool = True):
    """Resolve and check everything a training job needs before any process starts.

    ``values``: keys given from Python (the supervised Trainer), like command-line keys;
    ``prepare_hook=False`` skips the algorithm's command-line preparation (the Trainer's task
    comes as Python objects, not as a name to import).
    """
    from ddprl.checkpoint import load_checkpoint
    from ddprl.config import load_config
    from ddprl.run import resolve_resume, run_dir_of_checkpoint
    from ddprl.runtime import resolved_config

    overrides = _launcher_overrides(overrides)
    cfg = load_config(overrides, config_name, values=values)
    algorithm = registry.get(cfg.algo, cfg.engine)
    ckpt_path = resolve_resume(cfg.resume, cfg.run_dir, cfg.algo)
    if ckpt_path is not None:
        saved = load_checkpoint(ckpt_path, expect_algo=cfg.algo)["config"]
        resumed = {k: v for k, v in saved.items() if k not in NOT_RESUMED}
        cfg = load_config(overrides, config_name, resumed=resumed, values=values)
        if getattr(cfg, "task", None) != saved.get("task"):
            raise UsageError(f"resume: checkpoint {ckpt_path} is for task={saved['task']}, not task={cfg.task}")
        for key in algorithm.architecture_keys:
            if getattr(cfg, key) != saved.get(key):
                raise UsageError(f"resume: {key}={getattr(cfg, key)!r} differs from the checkpoint's {saved.get(key)!r}")
        run_dir = cfg.run_dir or str(run_dir_of_checkpoint(ckpt_path))
        cfg = dataclasses.replace(cfg, resume=str(ckpt_path), run_dir=run_dir)
    elif cfg.resume:  # resume=auto with nothing to resume yet
        cfg = dataclasses.replace(cfg, resume="")
    cfg = resolved_config(cfg)
    prepare = algorithm.prepare_fn() if prepare_hook else None
    if prepare is not None:
        cfg = prepare(cfg, overrides, config_name, ckpt_path is not None)
    cfg.check()
    if os.environ.get("RANK", "0") == "0" and os.environ.get("SLURM_PROCID", "0") == "0":  # said once per job
        for line in cfg.learning_warnings():
            print(f"ddprl: warning: {line}", file=sys.stderr, flush=True)
    if cfg.enable_wandb:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise UsageError("enable_wandb=true needs the wandb package: pip install 'ddprl[wandb]'") from None
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from ddprl.checkpoint import forget_checkpoint
    from ddprl.runtime import launch, runs_in_this_process

    cfg = prepare_train(args.overrides, args.config_name)
    if not runs_in_this_process(cfg):
        forget_checkpoint()  # the ranks read it themselves; don't hold it here meanwhile
    algorithm = registry.get(cfg.algo, cfg.engine)
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
    kv = _key_values(overrides, {"checkpoint": str, "episodes": int, "device": str, "seed": int,
                                 "video": str, "deterministic": boolean}, "eval")
    if kv.get("episodes", 10) < 1:
        raise UsageError("eval: episodes must be >= 1")
    if "video" in kv:
        from ddprl.video import check_video_path, headless_rendering

        check_video_path(kv["video"])
        headless_rendering()  # before the ranks start: they inherit it
    saved = {k: v for k, v in ckpt["config"].items() if k not in NOT_RESUMED}
    # One process: a checkpoint from any number of ranks (and machines) evaluates here.
    extra = ["world_size=1", "nnodes=1", "progress=false",
             f"device={kv.get('device', 'auto')}", f"eval_episodes={kv.get('episodes', 10)}"]
    if not algorithm.has_key("eval_episodes"):
        raise UsageError(f"eval: algo={ckpt['algo']} has no evaluation episodes")
    if "seed" in kv:
        extra.append(f"seed={kv['seed']}")
    extra += _deterministic_override(kv, ckpt, "eval")
    cfg = load_config(extra, resumed=saved)
    launch(functools.partial(_eval_rank, ckpt=ckpt, video=kv.get("video")), cfg)
    return 0


def _eval_rank(rt: Any, cfg: Any, ckpt: dict[str, Any], video: str | None) -> None:
    from ddprl.evaluate import evaluate

    actor = registry.get(cfg.algo, cfg.engine).actor_loader()(cfg, ckpt["state"], rt.device)
    result = evaluate(rt, actor.make_env, actor.act, cfg.eval_episodes, cfg.seed, actor.extra_keys)
    if rt.is_main:  # the numbers first: a video that cannot be drawn does not take them away
        extras = " ".join(f"{k}={v:.4g}" for k, v in result.items() if k not in ("return_mean", "return_std", "episodes"))
        print(extras, flush=True)
        print(f"return_mean={result['return_mean']:.4f} return_std={result['return_std']:.4f} "
              f"episodes={int(result['episodes'])}", flush=True)
    if video:
        from ddprl.video import record_video

        record_video(actor, video, seed=cfg.seed)


def cmd_play(args: argparse.Namespace) -> int:
    import torch

    from ddprl.checkpoint import load_checkpoint
    from ddprl.config import load_config

    kv = _key_values(args.overrides, {"checkpoint": str, "episodes": int, "fps": float, "video": str,
                                      "device": str, "seed": int, "deterministic": boolean}, "play")
    if "checkpoint" not in kv:
        raise UsageError("play: give checkpoint=PATH")
    device = kv.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"play: device={device!r} is not cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("play: device=cuda but no CUDA device is visible")
    if "video" in kv:
        from ddprl.video import check_video_path

        check_video_path(kv["video"])
    from ddprl.video import headless_rendering

    headless_rendering()  # before an env library is imported: making the actor imports them
    ckpt = load_checkpoint(_checkpoint_file(kv["checkpoint"]))
    saved = {k: v for k, v in ckpt["config"].items() if k not in NOT_RESUMED}
    cfg = load_config(["world_size=1", f"device={device}", "progress=false"]
                      + _deterministic_override(kv, ckpt, "play"), resumed=saved)
    seed = kv.get("seed", cfg.seed)
    # One process, one device: a checkpoint from N ranks plays here.
    actor = registry.get(cfg.algo, cfg.engine).actor_loader()(cfg, ckpt["state"], torch.device(device))
    if "video" in kv:
        from ddprl.video import record_video

        episodes = kv.get("episodes", 1)
        for episode in range(episodes):
            path = kv["video"] if episodes == 1 else _numbered(kv["video"], episode)
            label = f"episode {episode + 1}/{episodes}" if episodes > 1 else ""
            print(f"wrote {record_video(actor, path, seed=seed + episode, fps=kv.get('fps'), label=label)}",
                  flush=True)
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
        raise UsageError(f"{command}: deterministic= applies to algorithms with sampled and most likely actions; "
                         f"{ckpt['algo']} evaluates without exploration noise")
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

    kv = _key_values(args.overrides, {"world_size": str, "device": str, "backend": str, "master_port": str,
                                      "size_mb": float, "dist_timeout": float, "engine": str, "devices": str},
                     "doctor")
    size_mb = kv.pop("size_mb", 64.0)
    if "devices" in kv and kv.get("engine") != "jax":
        raise UsageError("doctor: devices= is a key of engine=jax (the torch engine has one device per rank)")
    cfg = resolved_config(load_config(_launcher_overrides([f"{k}={v}" for k, v in kv.items()])))
    if cfg.engine == "jax":
        from ddprl.jax.runtime import doctor as jax_doctor, launch as jax_launch

        jax_launch(functools.partial(jax_doctor, size_mb=size_mb), cfg)
        return 0
    from ddprl.doctor import doctor, describe_machine
    from ddprl.runtime import launch

    print(describe_machine(cfg), flush=True)
    launch(functools.partial(doctor, size_mb=size_mb), cfg)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from ddprl.config import describe

    kv = _key_values(args.overrides, {"algo": str, "engine": str}, "keys")
    if "algo" not in kv:
        print("algorithms (ddprl keys algo=NAME [engine=jax] lists the keys of one):")
        for algorithm in registry.declarations():
            print(f"  {algorithm.name:12s} {algorithm.engine:6s} {algorithm.description}")
        kv["algo"] = registry.DEFAULT_ALGO
        print(f"\nkeys of algo={kv['algo']}:")
    algorithm = registry.get(kv["algo"], kv.get("engine", registry.DEFAULT_ENGINE))
    for name, typ, help_ in describe(algorithm.config):
        print(f"{name:18s} {typ:22s} {help_}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from ddprl.plot import parse_plot_args, plot_runs

    run_dirs, options = parse_plot_args(args.overrides)
    print(f"wrote {plot_runs(run_dirs, **options)}", flush=True)
    return 0


def entry() -> None:
    """The ``ddprl`` command: run ``main`` and end the process with its exit code."""
    from ddprl.runtime import exit_process

    try:
        code = main()
    except SystemExit as e:  # a rank's exit code raised through launch (2: bad input, 75: preempted)
        code = e.code if isinstance(e.code, int) else 1
    exit_process(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddprl", description="Reinforcement learning with PyTorch DDP.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train an agent (key=value overrides)")
    p.add_argument("--config-name", default=None, help="a shipped config to start from (e.g. a multi-GPU preset)")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(fn=cmd_train)
    for name, fn, help_ in [("eval", cmd_eval, "evaluate a checkpoint in one process"),
                            ("play", cmd_play, "watch an agent in the terminal or write a video (one process)"),
                            ("doctor", cmd_doctor, "check devices, backend, all_reduce and bandwidth"),
                            ("plot", cmd_plot, "learning curves of run directories to a PNG"),
                            ("keys", cmd_keys, "list config keys with their help")]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("overrides", nargs="*")
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"ddprl: error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("ddprl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a rank failed: say which, briefly; its traceback was logged by it
        from ddprl.runtime import RankFailed

        if isinstance(e, RankFailed):
            print(f"ddprl: {e}", file=sys.stderr, flush=True)
            return 1
        raise
