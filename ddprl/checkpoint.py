"""Checkpoints: plain state dicts, written atomically by rank 0, loaded with ``weights_only=True``.

Layout of a checkpoint file (docs/distributed.md, invariant 8), the same for every algorithm::

    {"format_version": 2, "algo": str, "step": int, "world_size": int, "config": {...},
     "counters": {"iteration": ..., ...},                 # the loop's own counters
     "state": {"model": state_dict, "optimizer": state_dict, ...},   # shared by all ranks
     "ranks": [{"rng": ..., "env": ..., ...}, ...],      # each rank's own state, in rank order
     "best": {"score": float, "step": int} | None}        # the best eval so far (best.pt)

Saving is collective (every rank calls it: each hands in its own state); rank 0 writes. A
checkpoint from N ranks loads in one CPU process. Another format version is refused with a
message naming both versions.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ddprl.errors import UsageError
from ddprl.files import copy_atomically, write_atomically
from ddprl.runtime.compat import COMPILED_PREFIX

if TYPE_CHECKING:
    from ddprl.runtime.protocol import JobRuntime

log = logging.getLogger("ddprl")

FORMAT_VERSION = 2
STEP_FILE = re.compile(r"step_(\d+)\.pt")

# The last checkpoint read in this process: the launcher's checks, the config and the training
# loop all ask for the same file, and a checkpoint can be GBs: it is read once per process.
_cached: tuple[tuple[str, int, int], dict[str, Any]] | None = None


class UnreadableCheckpoint(UsageError):
    """A checkpoint file that cannot be read at all (missing, truncated, corrupt, not ddprl's)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Remove wrapper prefixes (DDP's ``module.``, ``torch.compile``'s) from the *front* of keys only.

    A parameter called ``submodule.weight`` keeps its name: prefixes, never substrings.
    """
    out = {}
    for key, value in state_dict.items():
        while True:
            for prefix in ("module.", COMPILED_PREFIX):
                if key.startswith(prefix):
                    key = key[len(prefix) :]
                    break
            else:
                break
        out[key] = value
    return out


class Stateful(Protocol):
    """A part of the shared state a checkpoint holds: a module, an optimizer, a scaler, statistics."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


def state_of(parts: Mapping[str, Stateful | None]) -> dict[str, Any]:
    """The shared state of a checkpoint from a table of its parts, by key: each part's state dict
    (a module's keys without wrapper prefixes, :func:`strip_prefixes`); None for a part this job
    lacks. ``Run.restore`` loads the same table back."""
    state: dict[str, Any] = {}
    for name, part in parts.items():
        if part is None:
            state[name] = None
        elif isinstance(part, torch.nn.Module):
            state[name] = strip_prefixes(part.state_dict())
        else:
            state[name] = part.state_dict()
    return state


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch, CUDA, numpy, random) as weights_only-loadable values."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.as_tensor(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [list(random.getstate()[1]), random.getstate()[0], random.getstate()[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    internal, version, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def save_checkpoint(rt: JobRuntime, path: Path, payload: dict[str, Any], rank_state: dict[str, Any]) -> None:
    """Collective: gather every rank's ``rank_state``; rank 0 writes ``payload`` + them atomically.

    ``payload`` holds the shared state (identical on every rank): plain state dicts, counters,
    the config. Written to ``<path>.tmp`` then renamed, so a crash never leaves half a file.
    """
    ranks = rt.all_gather_object(_to_cpu(rank_state))
    if not rt.is_main:
        return
    data = {"format_version": FORMAT_VERSION, "world_size": rt.world_size, **_to_cpu(payload), "ranks": ranks}
    save_atomically(data, path)


def save_atomically(data: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to ``<path>.tmp``, then rename: a crash never leaves half a file, and a full
    disk raises :class:`~ddprl.errors.DiskFull` (the ``.tmp`` removed, ``path`` as it was)."""
    write_atomically(path, lambda f: torch.save(data, f))


def checkpoint_in(path: str | Path, prefer: tuple[str, ...] = ("best.pt", "latest.pt")) -> Path:
    """The checkpoint file ``path`` names: a file as given; a run directory (or its
    ``checkpoints/`` folder) gives the first of ``prefer`` found there.

    ``eval``/``play`` prefer best.pt (the best evaluated policy), then latest.pt (a run that
    never evaluated has no best.pt); ``resume`` asks for latest.pt, the newest training state.

    >>> checkpoint_in("runs/ppo-CartPole-v1-20261123-101500")        # doctest: +SKIP
    PosixPath('runs/ppo-CartPole-v1-20261123-101500/checkpoints/best.pt')
    """
    path = Path(path)
    if not path.is_dir():
        return path  # a file, or a missing path that load_checkpoint reports
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    for name in prefer:
        if (folder / name).is_file():
            return folder / name
    raise UsageError(
        f"{path}: no {' or '.join(prefer)} in {folder} (training writes them to "
        f"<run directory>/checkpoints/); give a run directory or a checkpoint file"
    )


def load_checkpoint(path: str | Path, expect_algo: str | None = None) -> dict[str, Any]:
    """Load and check a checkpoint; bad files raise a UsageError that says what is wrong.

    The file is read once per process (until :func:`forget_checkpoint`): asking again for an
    unchanged file returns the same dict, so treat it as read-only.
    """
    global _cached
    path = Path(path)
    if not path.is_file():
        raise UnreadableCheckpoint(f"checkpoint {path} does not exist", "missing")
    stat = path.stat()
    cache_key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if _cached is not None and _cached[0] == cache_key:
        data = _cached[1]
    else:
        if stat.st_size and not _torch_file(path):
            run_dir = f" (this file's: {path.parent})" if (path.parent / "checkpoints").is_dir() else ""
            raise UnreadableCheckpoint(
                f"{path} is not a checkpoint: give a .pt file that training wrote (<run directory>/checkpoints/"
                f"latest.pt, best.pt, step_<N>.pt) or a run directory{run_dir}",
                "not a torch file",
            )
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated or corrupt
            reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
            raise UnreadableCheckpoint(f"checkpoint {path} cannot be read ({reason})", reason) from None
        if not isinstance(data, dict) or "format_version" not in data:
            raise UnreadableCheckpoint(f"{path} is not a ddprl checkpoint (no format_version)", "no format_version")
        _cached = (cache_key, data)
    if data["format_version"] != FORMAT_VERSION:
        raise UsageError(
            f"{path} has checkpoint format_version {data['format_version']}; this ddprl reads "
            f"format_version {FORMAT_VERSION} (use the ddprl version that wrote it)"
        )
    if expect_algo is not None and data.get("algo") != expect_algo:
        raise UsageError(f"checkpoint {path} was written by algo={data.get('algo')}, not algo={expect_algo}")
    return data


def _torch_file(path: Path) -> bool:
    """Whether ``path`` starts as a file of ``torch.save`` does: a zip archive, or (before torch
    1.6) a pickle."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith((b"PK\x03\x04", b"\x80"))


def forget_checkpoint() -> None:
    """Drop the checkpoint kept in memory by :func:`load_checkpoint` (once its state is in use)."""
    global _cached
    _cached = None


def buffer_path(checkpoint_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its replay buffer next to the checkpoints (``checkpoint_buffer``)."""
    return Path(checkpoint_dir) / "buffers" / f"rank{rank}.pt"


class Reshardable(Protocol):
    """A replay buffer that can be saved per rank and dealt out again over another number of ranks."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    @staticmethod
    def episodes_of(state: dict[str, Any]) -> list[Any]:
        """The episodes a saved ``state`` holds, oldest first."""
        ...

    def extend(self, episodes: list[Any]) -> None:
        """Add ``episodes`` oldest first (the ring drops the oldest beyond its capacity)."""
        ...


def restore_buffer(buffer: Reshardable, checkpoint_dir: Path, ckpt: dict[str, Any], rank: int, world_size: int) -> bool:
    """Fill this rank's ``buffer`` from the replays saved with ``ckpt`` (``checkpoint_buffer``) in
    ``checkpoint_dir``; whether it was.

    On as many ranks as saved it, each rank takes its own file back. On another number of ranks the
    saved episodes are pooled (interleaved by age across the saved ranks) and dealt out in turn, so
    each rank gets an even share of every saved rank's episodes, oldest first. A missing, stale
    (buffers are kept for the latest checkpoint only) or unreadable file gives False, and the caller
    refills the buffers instead.
    """
    saved_ranks = int(ckpt["world_size"])
    own = [rank] if saved_ranks == world_size else list(range(saved_ranks))
    shards = []
    for r in own:
        path = buffer_path(checkpoint_dir, r)
        if not path.is_file():
            return False
        try:
            # each rank reads every saved file but copies out only its share: mapped, not read whole
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=saved_ranks != world_size)
            if saved["step"] != ckpt["step"]:
                log.warning(
                    "replay buffer %s is from step %d, the checkpoint from step %d: not restored",
                    path,
                    saved["step"],
                    ckpt["step"],
                )
                return False
            if saved_ranks == world_size:
                buffer.load_state_dict(saved["buffer"])
                return True
            shards.append(type(buffer).episodes_of(saved["buffer"]))
        except Exception as e:  # truncated, corrupt, other shapes: whatever it is, the remedy is to refill
            log.warning("replay buffer %s not restored: %s", path, str(e).splitlines()[0][:200])
            return False
    pooled = [
        episode
        for _, _, episode in sorted(
            ((i / len(shard), r, episode) for r, shard in enumerate(shards) for i, episode in enumerate(shard)),
            key=lambda entry: entry[:2],
        )
    ]
    buffer.extend(pooled[rank::world_size])
    if rank == 0:
        log.info(
            "replay re-sharded: the %d episodes of %d ranks' replays dealt out over %d rank(s), each keeping "
            "the newest its capacity holds",
            len(pooled),
            saved_ranks,
            world_size,
        )
    return True


# -- where checkpoints are: the run directory's checkpoints/ -----------------------------------------


def resolve_resume(resume: str, run_dir: str, algo: str) -> Path | None:
    """The checkpoint to resume from, checked before any process starts (None: fresh start).

    ``resume=auto`` takes the newest checkpoint of ``<run_dir>/checkpoints`` that loads
    (latest.pt, else the step files newest first; one warning names those skipped) and starts
    fresh when there is none, so a requeued or restarted job just re-runs the same command.
    """
    if not resume:
        return None
    if resume == "auto":
        if not run_dir:
            raise UsageError("resume=auto needs run_dir=<the run's directory>")
        return newest_loadable(Path(run_dir) / "checkpoints", algo)
    path = checkpoint_in(resume, prefer=("latest.pt",))  # a run directory resumes from its newest state
    load_checkpoint(path, expect_algo=algo)  # raises a UsageError for missing/truncated/foreign files
    return path.resolve()


def newest_loadable(checkpoint_dir: Path, algo: str) -> Path | None:
    """latest.pt, else the newest ``step_<N>.pt`` that loads; None when nothing does.

    A file that cannot be read (truncated, corrupt: a crash or a full disk) is skipped with one
    warning; a readable checkpoint of another algorithm is still an error (a wrong run_dir).
    """
    candidates = [checkpoint_dir / "latest.pt"] + [
        p for _, p in reversed(Checkpointer(checkpoint_dir.parent).step_files())
    ]
    skipped = []
    for path in candidates:
        if not path.exists():
            continue
        try:
            load_checkpoint(path, expect_algo=algo)
        except UnreadableCheckpoint as e:
            skipped.append(f"{path.name} ({e.reason})")
            continue
        if skipped:
            log.warning("resume=auto: skipped %s; resuming from %s", ", ".join(skipped), path)
        return path.resolve()
    if skipped:
        log.warning(
            "resume=auto: no checkpoint in %s loads (skipped %s); starting fresh", checkpoint_dir, ", ".join(skipped)
        )
    else:
        log.info("resume=auto: no checkpoint in %s yet, starting fresh", checkpoint_dir)
    return None


def run_dir_of_checkpoint(path: Path) -> Path:
    """``runs/X/checkpoints/step_N.pt`` → ``runs/X``."""
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def _link(src: Path, dst: Path) -> None:
    """Atomically make ``dst`` a hard link to ``src`` (a copy where links are impossible)."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)  # same bytes, no second write; survives src being pruned
    except OSError:
        copy_atomically(src, dst)
        return
    os.replace(tmp, dst)


class Checkpointer:
    """Writes ``checkpoints/step_<N>.pt``, points ``latest.pt`` (and ``best.pt``) at it, prunes old ones."""

    def __init__(self, run_dir: Path, keep_last: int = 0):
        self.dir = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def step_files(self) -> list[tuple[int, Path]]:
        """``(N, step_<N>.pt)`` of the directory, oldest first."""
        found = [(int(m.group(1)), p) for p in self.dir.glob("step_*.pt") if (m := STEP_FILE.fullmatch(p.name))]
        return sorted(found)

    def save(
        self, rt: JobRuntime, step: int, payload: dict[str, Any], rank_state: dict[str, Any], is_best: bool = False
    ) -> Path:
        """Collective: every rank hands in its own state; rank 0 writes, links and prunes."""
        path = self.dir / f"step_{step}.pt"
        save_checkpoint(rt, path, payload, rank_state)
        if rt.is_main:
            _link(path, self.dir / "latest.pt")
            if is_best:
                _link(path, self.dir / "best.pt")
            if self.keep_last > 0:
                for _, old in self.step_files()[: -self.keep_last]:
                    old.unlink(missing_ok=True)  # latest.pt and best.pt are links of their own
        return path

    def point_latest_at(self, path: Path) -> None:
        """Make latest.pt the checkpoint being resumed when it is another file of this directory
        (resume=auto skipped a damaged newest one, or the user named an older step)."""
        latest = self.dir / "latest.pt"
        if path.parent.resolve() == self.dir.resolve() and path.name != "latest.pt" and path.exists():
            if not (latest.exists() and os.path.samefile(latest, path)):
                _link(path, latest)

    def drop_after(self, step: int) -> list[Path]:
        """Remove step checkpoints past ``step`` (a resumed run abandons that future)."""
        dropped = [p for n, p in self.step_files() if n > step]
        for p in dropped:
            p.unlink()
        return dropped
