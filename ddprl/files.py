"""Writing a run's files: whole or not at all, and a full disk said in one line.

Every file of a run directory is written through here: checkpoints, buffers and config.yaml
through :func:`write_atomically` (a ``<name>.tmp`` renamed over the file), metrics rows through
:class:`AppendFile`. A write that does not fit (ENOSPC, EDQUOT) leaves the file as it was (the
partial ``.tmp`` removed, a cut row truncated away) and raises :class:`~ddprl.errors.DiskFull`,
whose message names the path, the bytes the write needed and the bytes free (``os.statvfs``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ddprl.errors import DiskFull

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the filesystem (or the user's quota) has no room for a write."""
    return isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS


def free_bytes(path: str | Path) -> int | None:
    """Bytes this user may still write on the filesystem of ``path`` (its nearest existing
    ancestor); None where ``statvfs`` cannot tell."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(path: str | Path, needed: int | None, error: OSError) -> DiskFull:
    """The one-line :class:`DiskFull` of a write of ``needed`` bytes to ``path`` that ``error`` refused."""
    free = free_bytes(path)
    what = os.strerror(error.errno).lower() if error.errno else "no space left on device"
    room = [f"{needed:,} bytes needed"] if needed is not None else []
    room += [f"{free:,} {'free' if room else 'bytes free'}"] if free is not None else []
    return DiskFull(f"{what} writing {path}" + (f" ({', '.join(room)})" if room else ""))


class _CountingWriter:
    """A binary file that writes until the disk is full, then only counts: the writer (torch.save)
    runs to its end, so the whole file's size is known for the message."""

    def __init__(self, file: BinaryIO):
        self.file = file
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: bytes | memoryview) -> int:
        n = memoryview(data).nbytes
        if self.error is None:
            try:
                self.file.write(data)
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.error = e
        self.size += n
        return n

    def flush(self) -> None:
        if self.error is None:
            try:
                self.file.flush()
            except OSError as e:
                if not is_disk_full(e):
                    raise
                self.error = e


def write_atomically(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(file)`` into ``<path>.tmp``, then rename it over ``path``: a crash never leaves half a
    file at ``path``, and a full disk raises :class:`DiskFull` with the ``.tmp`` removed.

    >>> write_atomically("run/checkpoints/step_8.pt", lambda f: torch.save(data, f))   # doctest: +SKIP
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    counter: _CountingWriter | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            counter = _CountingWriter(f)
            write(counter)  # type: ignore[arg-type]  # a file for what writers call: write, flush
            counter.flush()
        error = counter.error
    except OSError as e:  # mkdir, open, or the close that flushes the last bytes (NFS reports there)
        tmp.unlink(missing_ok=True)
        if not is_disk_full(e):
            raise
        raise disk_full(path, counter.size if counter else None, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if error is not None:
        tmp.unlink(missing_ok=True)
        raise disk_full(path, counter.size, error) from None
    os.replace(tmp, path)


def write_text_atomically(path: str | Path, text: str) -> None:
    """``text`` (UTF-8) to ``path`` through :func:`write_atomically`."""
    data = text.encode()
    write_atomically(path, lambda f: f.write(data))


def copy_atomically(src: str | Path, dst: str | Path) -> None:
    """A copy of ``src`` at ``dst`` through :func:`write_atomically` (where hard links are impossible)."""
    with open(src, "rb") as source:
        write_atomically(dst, lambda f: _copy_stream(source, f))


def _copy_stream(source: BinaryIO, target: BinaryIO, chunk: int = 1 << 20) -> None:
    while block := source.read(chunk):
        target.write(block)


class AppendFile:
    """A file that grows by whole records (metrics rows): a record that does not fit is cut away
    again (the file truncated to its size before) and :class:`DiskFull` raised, so the file never
    ends in half a row."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if is_disk_full(e):
                raise disk_full(self.path, 0, e) from None
            raise

    def append(self, data: bytes) -> None:
        """Write ``data`` whole at the end of the file, or not at all."""
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self.path} is closed")
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            if view.nbytes < len(data):
                os.ftruncate(fd, start)  # the row's first part went in: cut it away again
            if is_disk_full(e):
                raise disk_full(self.path, len(data), e) from None
            raise

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
