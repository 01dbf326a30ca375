"""Launch: spawn N processes, or attach to torchrun / SLURM; one rank's life cycle.

Launch modes, decided by :func:`~ddprl.runtime.placement.detect_launcher`:
- ``torchrun``: RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are set by the launcher.
- ``slurm``: one process per task started by ``srun`` (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID).
- ``spawn``: ``ddprl train world_size=N`` starts N local processes itself (``nnodes``/``node_rank``
  with ``master_addr``/``master_port`` spread one job over several machines).
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import logging
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.multiprocessing as mp

from ddprl.errors import DISK_FULL_EXIT_CODE, DiskFull, UsageError, say_once
from ddprl.runtime import collectives, failures, preemption
from ddprl.runtime.collectives import Runtime
from ddprl.runtime.malloc import keep_freed_memory
from ddprl.runtime.nccl import apply_nccl_preset
from ddprl.runtime.placement import (
    Placement,
    auto_world_size_note,
    bind_cores,
    check_port_free,
    choose_device_and_backend,
    detect_launcher,
    free_port,
    placement_from_env,
    resolved_config,
    spawn_master_addr,
)

if TYPE_CHECKING:
    from ddprl.runtime.protocol import LaunchConfig

Config = TypeVar("Config", bound="LaunchConfig")
Result = TypeVar("Result")

log = logging.getLogger("ddprl")

PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent dies


class RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class BarSafeHandler(logging.StreamHandler):
    """Writes each line through ``tqdm.write``: the progress bar is cleared and redrawn around it,
    so a log line never lands inside the bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def setup_logging(rank: int) -> tuple[list[logging.Handler], int, bool]:
    """``[RANK r]`` prefix on every line; rank 0 speaks at INFO, the others only warn. Returns
    the logger's settings before, for :func:`restore_logging`."""
    before = (list(log.handlers), log.level, log.propagate)
    handler = BarSafeHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[RANK %(rank)s] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.addFilter(RankFilter(rank))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False
    return before


def restore_logging(before: tuple[list[logging.Handler], int, bool]) -> None:
    """Put back what :func:`setup_logging` replaced: a rank run in the caller's process (one
    rank, the Trainer in a notebook) leaves the caller's logging as it found it."""
    log.handlers[:], level, log.propagate = before
    log.setLevel(level)


def prepare_spawn(cfg: LaunchConfig) -> int:
    """Check the spawn-mode settings in the parent and fix ``master_port`` (auto → a free port).

    Done before any process starts, so bad input fails with one line and nothing half-made.
    Returns the rendezvous port the children use.
    """
    spawn_sizes(cfg)
    # Validate the device/backend choice once, here, rather than in N children.
    choose_device_and_backend(cfg.device, cfg.backend, 0, cfg.world_size // cfg.nnodes)
    return spawn_port(cfg)


def spawn_sizes(cfg: LaunchConfig) -> None:
    """world_size, nnodes and node_rank of a spawn-mode job fit together (any engine)."""
    if cfg.world_size < 1:
        raise UsageError(f"world_size={cfg.world_size} must be >= 1")
    if cfg.nnodes < 1 or cfg.world_size % cfg.nnodes:
        raise UsageError(f"world_size={cfg.world_size} must be a multiple of nnodes={cfg.nnodes}")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise UsageError(f"node_rank={cfg.node_rank} must be in [0, nnodes={cfg.nnodes})")
    spawn_master_addr(cfg)  # several nodes need master_addr named


def spawn_port(cfg: LaunchConfig) -> int:
    """The rendezvous port of a spawn-mode job: ``auto`` picks a free one (one node only), a
    given one must be free on node 0."""
    if cfg.master_port == "auto":
        if cfg.nnodes > 1:
            raise UsageError("master_port=auto cannot be agreed between nodes; give master_port=<int> on every node")
        port = free_port()
    else:
        port = int(cfg.master_port)
        if cfg.node_rank == 0:
            check_port_free(spawn_master_addr(cfg), port)
    return port


def exit_process(code: int) -> None:
    """End this process with ``code``; without interpreter finalisation once it joined a process group.

    Why: gloo's worker threads can outlive ``close``. In torch 2.13 a DDP wrapper keeps its
    gloo process group alive after ``destroy_process_group`` (constructing DDP leaves references
    to the group that are never released), and without DDP a group's threads can still be
    finishing a collective's clean-up when the interpreter finalises. When such a thread frees
    a finished collective's tensors it takes the GIL; if the interpreter is finalising at that
    moment the thread is unwound through C++ code and the process aborts ("terminate called
    without an active exception", SIGABRT) although all its work is done and written. Seen in
    ~5% of 2-rank DDP runs here (gdb: ``pt_gloo_runloop`` in ``~AsyncAllgatherWork`` ->
    ``take_gil`` during ``Py_FinalizeEx``), and once in CI in a 2-rank run that used only
    all-reduces. A rank whose files are closed has nothing left for finalisation to do, so it
    runs the ``atexit`` handlers (W&B, multiprocessing's resource clean-up, logging), flushes
    and leaves with ``os._exit``.

    The same after a stop signal (SIGTERM/SIGUSR1): finalisation puts the default handlers back,
    and a repeated signal arriving then would kill the process instead of letting it exit 75.
    """
    if not collectives._group_joined and preemption.received() is None:
        sys.exit(code)
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _child(local_rank: int, fn: Callable, cfg: LaunchConfig, dist_timeout: float) -> None:
    placement = placement_from_env(cfg, environ={}, local_rank=local_rank)
    try:
        _run_rank(placement, fn, cfg, dist_timeout)
    except SystemExit as e:  # bad input (exit 2) found inside this rank
        exit_process(e.code if isinstance(e.code, int) else 1)
    # Any other exception propagates (exit code 1); the rank's report tells the launcher what it was.
    exit_process(0)


def _run_rank(
    placement: Placement, fn: Callable[[Runtime, Config], Result], cfg: Config, dist_timeout: float
) -> Result:
    logging_before = setup_logging(placement.rank)
    previous_handlers = preemption.install_handlers()  # SIGTERM/SIGUSR1: stop at a step boundary, saved
    nccl_preset = getattr(cfg, "nccl_preset", "none")
    nccl_set = apply_nccl_preset(nccl_preset)
    if nccl_set:
        log.info("nccl_preset=%s set %s", nccl_preset, " ".join(f"{k}={v}" for k, v in nccl_set.items()))
    # One intra-op thread per rank unless OMP_NUM_THREADS says otherwise: RL networks are small,
    # and OpenMP's thread hand-off on tiny tensors costs more than the op (seen here: tanh on
    # an 8x64 tensor took 5 us with 1 thread and 3.5 ms with 2), besides N ranks x all cores
    # oversubscribing the machine.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    # Denormal floats flushed to zero, as JAX and TensorFlow run on a CPU: Adam's moments of a unit that no
    # longer gets a gradient decay into the denormal range, where every op on them takes a microcode assist
    # (PPO on BeamRider: a fifth of the Nature CNN's dense-layer first moments by 1.5M steps; a compiled Adam
    # step over 1.7M floats with that share denormal takes 3.3 times as long). Threads made from here on inherit it.
    flushes = torch.set_flush_denormal(True)
    if getattr(cfg, "malloc", "keep") == "keep":
        keep_freed_memory()
    bound = bind_cores(getattr(cfg, "cpu_bind", "none"), placement)
    if bound and placement.rank == 0:
        log.info("cpu_bind: each rank on its own cores (rank 0: %s)", ",".join(map(str, bound)))
    rt = Runtime(placement, dist_timeout, getattr(cfg, "host_collectives", "auto"))
    matmuls_before = float32_matmuls(getattr(cfg, "precision", "fp32"), rt.device)
    try:
        result = fn(rt, cfg)
        # Leave together: no rank tears its process group down while a peer still has a
        # collective in flight with it (seen on torch 2.4: destroy_process_group never returned).
        rt.barrier()
        return result
    except UsageError as e:
        failures.record_failure(rt.rank, e, host=rt.named_host)
        if rt.is_main:
            print(f"ddprl: error: {e}", file=sys.stderr, flush=True)
        else:  # bad input seen by this rank alone would otherwise go unsaid
            log.error("rank %d: %s", rt.rank, e)
        sys.exit(2)
    except preemption.Preempted:  # every rank saved and left together (Run.preempted)
        sys.exit(preemption.PREEMPTED_EXIT_CODE)
    except DiskFull as e:  # every rank learned it together (Run); the first rank of each host says it
        say_once(f"ddprl: error: {e}", rt.first_on_host)
        sys.exit(DISK_FULL_EXIT_CODE)
    except BaseException as e:
        caught = time.monotonic()  # the launcher orders the ranks' errors by it
        # An echo of a peer's failure: who stopped answering says more than this rank's traceback.
        lost = rt.lost_peers(e) if failures.is_consequence(e) else None
        line, named = lost if lost is not None else (None, False)
        failures.record_failure(rt.rank, e, host=rt.named_host, caught=caught, lost=line, named=named)
        if line is not None:
            log.error("%s", line)
        else:
            log.error("rank %d failed:\n%s", rt.rank, traceback.format_exc())
        raise
    finally:
        rt.close()
        torch.set_float32_matmul_precision(matmuls_before)  # one rank runs in the caller's process
        if flushes:
            torch.set_flush_denormal(False)  # torch's default
        preemption.restore_handlers(previous_handlers)
        restore_logging(logging_before)


def float32_matmuls(precision: str, device: torch.device) -> str:
    """``precision=tf32`` on CUDA: float32 matrix products on TF32 tensor cores (inputs rounded to
    10 mantissa bits, sums in fp32; TD-MPC2 at model_size 5 made 135 agent steps/s on an H100
    against 112-125 in fp32). A process-wide setting, so it is made here, once per rank, and never
    on a CPU, where the same setting may pick oneDNN kernels that round through bf16: tf32 trains
    on a CPU exactly as fp32 does. Other precisions leave the process's setting as it is. Returns
    the setting before, which the rank restores as it ends."""
    before = torch.get_float32_matmul_precision()
    if precision == "tf32" and device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    return before


def launch(fn: Callable[[Runtime, Config], Result], cfg: Config) -> Result | None:
    """Run ``fn(runtime, cfg)`` on every rank of the job (use functools.partial for more arguments).

    Under torchrun or srun this process *is* one rank. Otherwise ``cfg.world_size`` processes are
    spawned here (``world_size / nnodes`` per node). When one rank fails, the others are stopped
    and ``launch`` raises ``RankFailed`` naming the root cause (see :func:`spawn`), or
    ``SystemExit(2)`` for bad input found inside a rank.
    A script of your own run under torchrun should end with ``exit_process(0)`` (see there).
    """
    launcher = detect_launcher()
    if launcher != "spawn":
        return _run_rank(placement_from_env(cfg), fn, cfg, cfg.dist_timeout)
    if cfg.world_size == "auto":
        cfg = resolved_config(cfg)
    port = prepare_spawn(cfg)  # the last check of the input: from here on, no bad-input exit
    if cfg.sources.get("world_size") == "auto" and cfg.node_rank == 0:
        print(f"ddprl: {auto_world_size_note(cfg.world_size, cfg.device, cfg.nnodes)}", file=sys.stderr, flush=True)
    cfg = dataclasses.replace(cfg, master_port=str(port))
    nprocs = cfg.world_size // cfg.nnodes
    if nprocs == 1 and cfg.nnodes == 1:
        # One rank: run it in this process (same code path, a process group of one).
        return _run_rank(placement_from_env(cfg, environ={}, local_rank=0), fn, cfg, cfg.dist_timeout)
    spawn(_child, (fn, cfg, cfg.dist_timeout), nprocs, first_rank=cfg.node_rank * nprocs, several_hosts=cfg.nnodes > 1)
    return None


def spawn(
    child: Callable[..., None],
    args: tuple,
    nprocs: int,
    stop_grace_s: float = 30.0,
    first_rank: int = 0,
    several_hosts: bool = False,
) -> None:
    """Start ``child(local_index, *args)`` in ``nprocs`` fresh processes and wait for all; process
    ``i`` is rank ``first_rank + i`` of the job, which runs on this machine alone or on
    ``several_hosts`` (then a process that ended unasked is named with this host).

    When one fails the others are stopped (SIGTERM, then SIGKILL after ``stop_grace_s``) and,
    once all have ended, the root cause is reported: the earliest error that is not an echo of
    another process's death (:mod:`ddprl.runtime.failures`), whichever process exited first.
    Bad input found inside a process (exit code 2) becomes ``SystemExit(2)``, any other failure
    :class:`RankFailed` naming the rank and its error; when every process ended with 0, 74 (a
    disk full) or 75 (preempted, saved), ``SystemExit(74)`` or ``SystemExit(75)``. A SIGTERM or SIGUSR1 sent to this
    process is passed on to every child, which stop together at a step boundary with a checkpoint.
    """
    reports = failures.make_reports_dir()
    previous: dict[int, Any] = {}
    try:
        context = mp.start_processes(
            _reporting_child, args=(child, reports, args), nprocs=nprocs, join=False, start_method="spawn"
        )
        processes = context.processes

        def forward(signum: int, frame: Any) -> None:
            preemption.note(signum)
            for process in processes:
                if process.is_alive() and process.pid is not None:
                    try:
                        os.kill(process.pid, signum)
                    except ProcessLookupError:  # ended in between
                        pass

        previous = {sig: signal.signal(sig, forward) for sig in preemption.STOP_SIGNALS}
        ended_at = _wait_until_all_end_or_one_fails(processes)
        # Who ended unasked, and how: a process that failed without a report (killed by a signal,
        # os._exit) is a root cause candidate at the time it was seen to end.
        unasked = {i: processes[i].exitcode for i in ended_at}
        _stop(processes, stop_grace_s)
        failed = [
            _failure(reports, i, code, ended_at[i], first_rank + i, several_hosts)
            for i, code in unasked.items()
            if _failed(code)
        ]
        # Processes stopped here may still have reported an error of their own (or an echo).
        failed += [
            f
            for i in range(nprocs)
            if i not in unasked and (f := failures.read_report(_report_file(reports, i), i)) is not None
        ]
        cause = failures.root_cause(failed)
        together = [c for c in (DISK_FULL_EXIT_CODE, preemption.PREEMPTED_EXIT_CODE) if c in unasked.values()]
        # A full disk that some rank met alone: its peers' errors only echo its exit.
        if cause is None or (cause.consequence and DISK_FULL_EXIT_CODE in together):
            if together:
                raise SystemExit(together[0])
            return
        if cause.usage or (not cause.reported and unasked.get(cause.index) == 2):
            raise SystemExit(2)
        raise RankFailed(cause.message(), cause.traceback)
    finally:
        shutil.rmtree(reports, ignore_errors=True)
        if preemption.received() is None:  # else keep forwarding (to nobody): a repeat must not kill us
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _wait_until_all_end_or_one_fails(processes: list[Any]) -> dict[int, float]:
    """Wait until every process has ended, or one has failed; returns {index: when this launcher
    saw it end} for those that ended.

    Preempted ranks leave together (after a barrier), some an instant before the others: wait for
    all of them rather than stop the late ones as if they had failed. Each exit code is read once
    per pass: a process's sentinel can be ready before the process can be reaped, and one reaped
    between two reads must still be counted as ended (it was not, once: two ranks preempted
    together went unseen, and the job returned as if it had finished).
    """
    ended_at: dict[int, float] = {}
    pending = list(range(len(processes)))
    while pending:
        multiprocessing.connection.wait([processes[i].sentinel for i in pending])
        now = time.monotonic()
        for i in pending:
            if processes[i].exitcode is not None:
                ended_at[i] = now
        pending = [i for i in pending if i not in ended_at]
        if any(_failed(processes[i].exitcode) for i in ended_at):
            break
    return ended_at


def _failed(exitcode: int | None) -> bool:
    # 75 (preempted) and 74 (disk full): every rank leaves with it together, after a collective
    return exitcode not in (None, 0, preemption.PREEMPTED_EXIT_CODE, DISK_FULL_EXIT_CODE)


def _report_file(reports: str, index: int) -> str:
    return os.path.join(reports, f"process{index}.json")


def _reporting_child(index: int, child: Callable[..., None], reports: str, args: tuple) -> None:
    """``child(index, *args)`` in a spawned process whose failure report goes to ``reports``.

    An error ends the process here with code 1, so that torch.multiprocessing does not write
    its own copy of the traceback to a temporary file nobody reads or removes.
    """
    report = _report_file(reports, index)
    failures.report_to(report)
    _end_with_the_launcher()
    try:
        child(index, *args)
    except (SystemExit, KeyboardInterrupt):  # KeyboardInterrupt: torch's way to end a child whose parent died
        raise
    except BaseException as e:
        if not os.path.exists(report):  # failed before its rank could report (set-up, placement): say it here
            failures.record_failure(None, e)
            traceback.print_exc()
        exit_process(1)


def _end_with_the_launcher() -> None:
    """When the launcher dies (SIGKILL, the OOM killer), this rank gets SIGTERM: it saves at the
    next step boundary and leaves with its peers (exit 75), as a preempted job does. torch's
    spawn sends SIGINT instead, which a job started in the background ignores: its ranks would
    train on as orphans. Linux only (prctl); elsewhere torch's SIGINT stays."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl: torch's SIGINT stays
        pass


def _failure(
    reports: str, index: int, exitcode: int, seen_at: float, rank: int, several_hosts: bool
) -> failures.Failure:
    """What process ``index`` (rank ``rank``), which ended with ``exitcode`` unasked, reported; or
    how it ended."""
    reported = failures.read_report(_report_file(reports, index), index)
    if reported is not None:
        return reported
    how = f"exited with code {exitcode}"
    if exitcode < 0:
        try:
            how += f" ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return failures.Failure(
        index=index,
        rank=rank,
        time=seen_at,
        summary=how,
        reported=False,
        host=socket.gethostname() if several_hosts else None,
    )


def _stop(processes: list[Any], grace_s: float) -> None:
    """SIGTERM to the processes still running, SIGKILL to those still running ``grace_s`` later;
    returns once all have ended."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            log.warning("process %d did not stop within %.0f s of SIGTERM: SIGKILL", process.pid, grace_s)
            process.kill()
        process.join()


def runs_in_this_process(cfg: LaunchConfig) -> bool:
    """Whether ``launch`` runs the rank in this very process (torchrun/srun, or a world of one)."""
    return detect_launcher() != "spawn" or (cfg.world_size == 1 and cfg.nnodes == 1)


class RankFailed(RuntimeError):
    """A rank of a spawned job failed; the others were stopped. The message names the rank and
    its error in one line; ``traceback`` is that rank's (empty when it ended without a report)."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback
