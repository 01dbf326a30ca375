"""The keys every job has (:class:`JobConfig`) and those every RL job adds (:class:`RLConfig`).

Each algorithm's own keys live in a config class next to its loop (``ddprl/algos/<name>/
config.py``), a subclass of one of these. A key is declared once, with its type, its help line
and (here) its default; an algorithm's defaults file may give inherited keys other values.
Keys are flat on the command line (``batch_size=256``). Global and local sizes are named apart:
``num_envs`` and ``steps`` are global (summed over ranks), ``batch_size`` is per rank, and
derived sizes (``local_num_envs``, ``effective_batch_size``) are methods, never inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, Optional

from ddprl.errors import UsageError


def key(help: str, default: Any = MISSING, type_name: str | None = None) -> Any:
    """A config field with its help line; without ``default`` the algorithm's defaults file gives it.

    ``type_name``: what ``ddprl keys`` shows as the type where the annotation says too little
    (``Any`` for "auto or a number").
    """
    metadata = {"help": help} if type_name is None else {"help": help, "type_name": type_name}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


@dataclass(kw_only=True)
class JobConfig:
    """What every ddprl job has, RL or supervised: launch, devices, precision, run directory,
    logging, checkpoints and resume."""

    algo: str = key("algorithm (ddprl keys lists them; `ddprl keys algo=NAME` its keys)", "ppo")
    engine: str = key("torch | jax: what runs the algorithm (jax: `pip install 'ddprl[jax]'`, docs/jax.md)", "torch")
    seed: int = key("base seed; every generator derives from (seed, global rank, purpose)", 1)
    # -- distributed ------------------------------------------------------------------------
    world_size: Any = key(
        "processes in the job: a number, or auto (one per visible GPU with CUDA, else 2; engine=jax: "
        "one per machine, nnodes); torchrun/SLURM set it themselves",
        "auto",
        type_name="int | auto",
    )
    nnodes: int = key("machines in a spawn-mode job (world_size is split evenly over them)", 1)
    node_rank: int = key("index of this machine in a spawn-mode multi-node job", 0)
    device: str = key("auto | cpu | cuda (rank -> cuda:LOCAL_RANK)", "auto")
    backend: str = key("auto | nccl | gloo (auto: NCCL when every rank owns a GPU)", "auto")
    master_addr: str = key(
        "host of rank 0: auto = the launcher's (torchrun, SLURM's first node, MASTER_ADDR), "
        "this machine on one node; name it for a multi-node spawn",
        "auto",
    )
    master_port: str = key(
        "port of the rendezvous: auto = the launcher's, or a free one (single node), "
        "or 20000 + job id mod 20000 under SLURM",
        "auto",
    )
    dist_timeout: float = key("seconds before a stuck collective fails the job", 300.0)
    host_collectives: str = key(
        "auto | shm | gloo: how CPU ranks on one machine reduce tensors (auto: through shared memory, "
        "microseconds a call, when every rank is on this x86-64 Linux machine; else gloo)",
        "auto",
    )
    cpu_bind: str = key(
        "none | cores: cores keeps each CPU rank, and the processes it starts, on its own share of this "
        "machine's cores (none: the scheduler places them)",
        "none",
    )
    malloc: str = key(
        "keep | system: keep = the C library's malloc keeps the memory a rank frees for its next step "
        "(CPU steps run faster without a page fault per fresh 4 kB page; set for the whole process); "
        "system = its own defaults",
        "keep",
    )
    nccl_preset: str = key(
        "none | nvlink | ib: NCCL variables for the interconnect (variables you exported win)", "none"
    )
    # -- optimisation -----------------------------------------------------------------------
    batch_size: int = key("samples per update on each rank", 256)
    sync_freq: int = key("all-reduce gradients every k updates (accumulate locally in between)", 1)
    precision: str = key(
        "fp32 | tf32 (fp32 with TF32 matrix products on CUDA; fp32 on a CPU) | bf16 | fp16 (with a gradient scaler)",
        "fp32",
    )
    compile: bool = key(
        "torch.compile the hot paths (each algorithm's guide says which; CUDA graphs on one GPU)", False
    )
    # -- run directory, logs, checkpoints ----------------------------------------------------
    run_dir: str = key("run directory ('' -> runs/<algo>[-<task>]-<time>)", "")
    resume: str = key("'' | auto (latest.pt in run_dir) | path to a checkpoint", "")
    keep_last: int = key("step checkpoints kept on disk, newest first (0: all); latest.pt and best.pt are kept", 3)
    progress: bool = key("show a progress bar on rank 0", True)
    enable_wandb: bool = key("log to Weights & Biases too", False)
    wandb_project: str = key("W&B project", "ddprl")
    wandb_entity: str = key("W&B entity ('' for your default)", "")
    wandb_mode: str = key("online | offline (offline needs no network; sync later)", "online")
    # Resumed on another number of ranks, the samples behind an optimizer step stay (prepare.same_global_batch
    # scales batch_size per rank); an algorithm whose batch_size must stay per rank says why here instead.
    PER_RANK_BATCH: ClassVar[str] = ""
    PRECISIONS: ClassVar[tuple[str, ...]] = ("fp32", "tf32", "bf16", "fp16")  # an algorithm may add its own
    # Not a key: which layer gave each value (load_config fills it; config.yaml and `ddprl keys` show it).
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False, metadata={"internal": True})

    def __post_init__(self) -> None:
        ws = self.world_size
        _check(
            ws == "auto" or (isinstance(ws, int) and not isinstance(ws, bool) and ws >= 1),
            f"world_size={ws!r} must be auto or an integer >= 1",
        )
        _check(self.nnodes >= 1, f"nnodes={self.nnodes} must be >= 1")
        _check(
            self.host_collectives in ("auto", "shm", "gloo"),
            f"host_collectives={self.host_collectives!r} is not auto, shm or gloo",
        )
        _check(
            self.cpu_bind in ("cores", "none"),
            f"cpu_bind={self.cpu_bind!r} is not cores or none",
        )
        _check(self.malloc in ("keep", "system"), f"malloc={self.malloc!r} is not keep or system")
        _check(self.sync_freq >= 1, f"sync_freq={self.sync_freq} must be >= 1")
        _check(self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1")
        _check(self.dist_timeout > 0, f"dist_timeout={self.dist_timeout} must be > 0")
        _check(self.keep_last >= 0, f"keep_last={self.keep_last} must be >= 0 (0 keeps every checkpoint)")
        _check(
            self.precision in self.PRECISIONS,
            f"precision={self.precision!r} is not one of {', '.join(self.PRECISIONS)}",
        )
        _check(self.device in ("auto", "cpu", "cuda"), f"device={self.device!r} is not one of auto, cpu, cuda")
        _check(self.backend in ("auto", "nccl", "gloo"), f"backend={self.backend!r} is not one of auto, nccl, gloo")
        _check(
            self.nccl_preset in ("none", "nvlink", "ib"),
            f"nccl_preset={self.nccl_preset!r} is not one of none, nvlink, ib",
        )
        _check(self.wandb_mode in ("online", "offline"), f"wandb_mode={self.wandb_mode!r} is not online or offline")
        port = str(self.master_port)
        _check(
            port == "auto" or (port.isdigit() and 0 < int(port) < 65536),
            f"master_port={port!r} must be auto or a port number in 1..65535",
        )

    def resolved(self, world_size: int) -> JobConfig:
        """This config with ``world_size`` (and any size derived from it) made concrete."""
        return dataclasses.replace(self, world_size=world_size)

    def check(self) -> list[str]:
        """Checks across keys that training needs, after sizes are resolved, before any process
        starts (eval and play skip them): a UsageError for what cannot run; returned, one line
        each with the numbers and the key to change, what runs but cannot do what it is for (no
        update before the end, an evaluation that never comes)."""
        return []

    def check_task(self) -> None:
        """A UsageError naming near matches when ``task`` is none this algorithm knows (or its
        package is missing); jobs without a task have nothing to check."""

    def run_name(self) -> str:
        """The stem of the default run directory name (``<stem>-<time>``)."""
        return self.algo

    def effective_batch_size(self, world_size: int) -> int:
        """Samples behind one optimizer step: batch_size x world_size x sync_freq (logged, never an input)."""
        return self.batch_size * world_size * self.sync_freq


@dataclass(kw_only=True)
class RLConfig(JobConfig):
    """An RL job: a task, environments on every rank, a budget of global steps, evaluations."""

    task: str = key("environment: a Gymnasium id (CartPole-v1, HalfCheetah-v5, ...), a DMC task, snake")
    steps: int = key("training budget in global agent steps (summed over ranks)")
    num_envs: Optional[int] = key("environments in the whole job, split evenly over ranks (null: one per rank)")
    eval_freq: int = key("evaluate every this many global steps (0: only at the end)")
    eval_episodes: int = key("episodes per evaluation, split over ranks")
    checkpoint_freq: int = key("checkpoint every this many global steps (0: only at the end)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.steps > 0, f"steps={self.steps} must be > 0")
        _check(self.num_envs is None or self.num_envs >= 1, f"num_envs={self.num_envs} must be >= 1 or null")
        _check(self.eval_freq >= 0, f"eval_freq={self.eval_freq} must be >= 0")
        _check(self.eval_episodes >= 0, f"eval_episodes={self.eval_episodes} must be >= 0")
        _check(self.checkpoint_freq >= 0, f"checkpoint_freq={self.checkpoint_freq} must be >= 0")
        if isinstance(self.world_size, int) and self.num_envs is not None and self.num_envs % self.world_size:
            raise UsageError(
                f"num_envs={self.num_envs} is not divisible by world_size={self.world_size}; "
                f"num_envs is global, use a multiple of {self.world_size}"
            )

    def resolved(self, world_size: int) -> RLConfig:
        """World size made concrete; ``num_envs=null`` becomes one environment per rank."""
        num_envs = world_size if self.num_envs is None else self.num_envs
        return dataclasses.replace(self, world_size=world_size, num_envs=num_envs)

    def check_task(self) -> None:
        from ddprl.envs import check_task

        check_task(self.task)

    def check(self) -> list[str]:
        self.check_task()
        return self.schedule_warnings()

    def schedule_warnings(self) -> list[str]:
        """Evaluation and checkpoint frequencies that ``steps`` never reaches."""
        out = []
        if self.eval_freq > self.steps and self.eval_episodes > 0:
            out.append(
                f"eval_freq={self.eval_freq} is beyond steps={self.steps}: the only evaluation is the final "
                "one (lower eval_freq)"
            )
        if self.checkpoint_freq > self.steps:
            out.append(
                f"checkpoint_freq={self.checkpoint_freq} is beyond steps={self.steps}: the only checkpoint "
                "is the final one, a stopped job resumes from the start (lower checkpoint_freq)"
            )
        return out

    def run_name(self) -> str:
        return f"{self.algo}-{self.task.replace('/', '_')}"

    def local_num_envs(self, world_size: int) -> int:
        """Environments on each rank (``num_envs`` is global; null means one per rank)."""
        return 1 if self.num_envs is None else self.num_envs // world_size


def public_fields(schema: Any) -> list[dataclasses.Field]:
    """The fields of a config class (or instance) that are keys: not the internal ``sources``."""
    return [f for f in dataclasses.fields(schema) if not f.metadata.get("internal")]
