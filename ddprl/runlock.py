"""One job per run directory: the job's rank-0 launching process holds ``<run_dir>/.lock``.

Two jobs training in one directory would append to one metrics.jsonl and overwrite each other's
checkpoints, so a second ``ddprl train run_dir=X`` is refused in one line (exit code 2) naming
the holder: host, pid and start time, which the holder writes into the file.

The lock is an ``flock`` on that file, taken before the job writes anything there and kept for
the job's life. The kernel drops it when its holder's process ends, SIGKILL included, so a
crashed job never blocks ``resume=auto``; the file is removed when a job ends normally. Only
the process that starts the job on the first machine holds it (the spawning launcher of
``node_rank=0``; rank 0's own process under torchrun or srun); its fd is closed on exec
(spawned ranks) and in forked children, so no orphan keeps the lock. Where the filesystem
cannot lock (some NFS set-ups), one warning says so and the job runs unlocked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ddprl.errors import UsageError, first_process
from ddprl.files import disk_full, is_disk_full

if TYPE_CHECKING:
    from ddprl.config.schema import JobConfig

Config = TypeVar("Config", bound="JobConfig")

LOCK_NAME = ".lock"
# flock refused by the filesystem itself rather than by another holder
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)

_held: int | None = None  # the fd of the lock this process holds


def _forget_in_child() -> None:
    """A forked child closes its copy of the lock's fd: the lock is its parent's, not an orphan's."""
    global _held
    if _held is not None:
        with contextlib.suppress(OSError):
            os.close(_held)
        _held = None


os.register_at_fork(after_in_child=_forget_in_child)


def holds_the_lock(cfg: JobConfig) -> bool:
    """Whether this process starts the job on its first machine: the spawning launcher of
    ``node_rank=0``, or rank 0's own process under torchrun or srun."""
    from ddprl.runtime import detect_launcher

    if detect_launcher() == "spawn":
        return cfg.node_rank == 0
    return first_process()


@contextlib.contextmanager
def run_dir_held(cfg: Config) -> Iterator[Config]:
    """For the life of the job (around ``launch``): lock the run directory when this process
    :func:`holds_the_lock`, creating the directory (a default one named here, so that the lock
    comes before anything is written); yields ``cfg`` with that ``run_dir``.

    A directory this job created and left without a file (bad input found in a rank) is removed.

    >>> with run_dir_held(cfg) as cfg:          # doctest: +SKIP
    ...     launch(train, cfg)
    """
    if not holds_the_lock(cfg):
        yield cfg
        return
    # created here: removed again if the job leaves it without a file
    created: Path | None
    if cfg.run_dir:
        path = Path(cfg.run_dir)
        created = _first_missing(path)
        _mkdir(path, exist_ok=True)
    else:
        path, created = _new_default_dir(cfg)
        cfg = dataclasses.replace(cfg, run_dir=str(path))
    try:
        fd = lock(path)
    except BaseException:
        if created is not None:
            _remove_if_empty(created)
        raise
    try:
        yield cfg
    finally:
        unlock(path, fd)
        if created is not None:
            _remove_if_empty(created)


def refuse_if_in_use(run_dir: Path) -> None:
    """A UsageError naming the holder when another job holds ``run_dir``'s lock; creates nothing.
    Called early (before the task is checked), so that a refused job says only that."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file: no job there (anything else, :func:`lock` says)
        return
    try:
        # shared: two jobs probing at once do not refuse each other (a holder's lock is exclusive)
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(_in_use(run_dir, fd)) from None
    except OSError:  # the filesystem cannot lock: lock() warns
        pass
    finally:
        os.close(fd)  # and with it the probe's lock


def lock(run_dir: Path, tries: int = 5) -> int | None:
    """Take ``run_dir``'s lock for this process: its fd, or None where the filesystem cannot lock
    (one warning). A UsageError naming the holder when another process holds it (``tries``
    times, 50 ms apart: a probe of :func:`refuse_if_in_use` holds it for an instant)."""
    global _held
    path = run_dir / LOCK_NAME
    while True:
        fd = _open(path)
        try:
            _flock_exclusive(fd, tries)
        except BlockingIOError:
            message = _in_use(run_dir, fd)
            os.close(fd)
            raise UsageError(message) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in UNSUPPORTED:
                raise
            if path.stat().st_size == 0:  # made by this open: nothing in it says anything
                path.unlink(missing_ok=True)
            print(
                f"ddprl: warning: run_dir={run_dir} cannot be locked on its filesystem (flock: {e.strerror}): "
                "a second job started in it would not be refused",
                file=sys.stderr,
                flush=True,
            )
            return None
        if _is_at(fd, path):
            break
        os.close(fd)  # its holder removed the file as it ended, after this open: lock the one there now
    _name_holder(fd)
    _held = fd
    return fd


def unlock(run_dir: Path, fd: int | None) -> None:
    """Release the lock :func:`lock` took: its file removed, then the fd closed."""
    global _held
    if fd is None:
        return
    path = run_dir / LOCK_NAME
    if _is_at(fd, path):
        path.unlink(missing_ok=True)
    os.close(fd)
    if _held == fd:
        _held = None


def _flock_exclusive(fd: int, tries: int) -> None:
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == tries - 1:
                raise
            time.sleep(0.05)


def _in_use(run_dir: Path, fd: int) -> str:
    return f"run_dir={run_dir} is in use by another job ({_holder(fd)}): wait for it to end, or give another run_dir"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path, 0, e) from None
        raise UsageError(f"run_dir={path.parent}: cannot create {path.name} there ({e.strerror})") from None


def _is_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is the file now at ``path`` (not one unlinked since it was opened)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def _name_holder(fd: int) -> None:
    """Host, pid and start time into the lock file, for the message a second job gets."""
    since = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data + b"\n", 0)
    except OSError:  # a full disk: the lock holds all the same, its holder goes unnamed
        pass


def _holder(fd: int) -> str:
    """``pid 4242 on host gpu07 since 2026-12-02 10:15:00 UTC`` from the lock file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0))
        return f"pid {info['pid']} on host {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder not named yet"


def _mkdir(path: Path, exist_ok: bool) -> None:
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        if not exist_ok:
            raise
        raise UsageError(f"run_dir={path} is a file, not a directory") from None
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path, 0, e) from None
        raise UsageError(f"run_dir={path}: cannot create it ({e.strerror})") from None


def _new_default_dir(cfg: JobConfig) -> tuple[Path, Path]:
    """Create ``runs/<algo>-<task>-<time>`` (another suffix when a job started in the same second
    took it: created here, so two jobs never share it); returns it and the outermost folder created."""
    from ddprl.run import default_run_dir

    while True:
        path = default_run_dir(cfg)
        created = _first_missing(path) or path
        try:
            _mkdir(path, exist_ok=False)
            return path, created
        except FileExistsError:
            continue


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None: all of it exists)."""
    missing = None
    for folder in [path, *path.absolute().parents]:
        if folder.exists():
            return missing
        missing = folder
    return missing


def _remove_if_empty(path: Path) -> None:
    """Remove ``path`` and its folders when no file is left in them."""
    tree = list(os.walk(path, topdown=False))  # deepest folders first
    if any(files for _, _, files in tree):
        return
    for folder, _, _ in tree:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
