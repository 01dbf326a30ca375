"""Features of the installed torch that ddprl adapts to (pyproject's floor: torch 2.4).

Detected from signatures and attributes, never from version strings: builds and backports
disagree on versions, not on what a function accepts.

This is the one module that names torch's private APIs (``torch._…``,
``torch.distributed._…``, the wrapper attribute of ``torch.compile``; tests/test_compat.py
scans the rest of the repository for them). Where torch has a public API it is used first
and the private one is the fallback; where it has none, a missing private name degrades to
doing without (a report without its reason, a tensor not marked static), never to an error.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# --------------------------------------------------------------------------- DDP


@functools.cache
def ddp_accepts(keyword: str) -> bool:
    """Whether ``DistributedDataParallel(...)`` takes ``keyword`` in this torch."""
    return keyword in inspect.signature(DistributedDataParallel.__init__).parameters


def ddp_buffer_kwargs() -> tuple[dict[str, bool], bool]:
    """DDP keywords that sync buffers at construction only, never on forward.

    Returns ``(kwargs, broadcast_yourself)``. Newer torch (``forward_sync_buffers``, 2.13)
    separates the two syncs. Older torch has only ``broadcast_buffers``, and ``False`` there
    skips the construction-time broadcast too: the caller must broadcast the buffers itself.
    """
    if ddp_accepts("forward_sync_buffers"):
        return {"forward_sync_buffers": False}, False
    return {"broadcast_buffers": False}, True


# --------------------------------------------------------------------------- torch.compile's wrapper

# ``torch.compile(module)`` returns a wrapper that holds the module under this attribute, so a
# compiled module's state-dict keys start with it.
_COMPILED_ATTR = "_orig_mod"
COMPILED_PREFIX = _COMPILED_ATTR + "."


def compiled_inner(module: Any) -> nn.Module | None:
    """The module that ``torch.compile`` wrapped into ``module``; None when ``module`` is not such a wrapper."""
    inner = getattr(module, _COMPILED_ATTR, None)
    return inner if isinstance(inner, nn.Module) else None


# --------------------------------------------------------------------------- collectives inside a graph


def _funcol() -> Any:
    # No public module: functional collectives are what Dynamo traces into a graph.
    import torch.distributed._functional_collectives as funcol

    return funcol


def functional_all_reduce(tensor: torch.Tensor, op: str, group: Any) -> torch.Tensor:
    """All-reduce that returns a new tensor (traceable: it can sit inside a compiled graph)."""
    return _funcol().all_reduce(tensor, op, group)


def functional_all_gather(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``dim`` (traceable)."""
    funcol = _funcol()
    # the newer name first; older torch has only all_gather_tensor (same arguments)
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    return gather(tensor, dim, group)


# --------------------------------------------------------------------------- ops without a public name

_foreach_addcdiv = getattr(torch, "_foreach_addcdiv_", None)


def foreach_addcdiv_(
    tensors: list[torch.Tensor], numerators: list[torch.Tensor], denominators: list[torch.Tensor]
) -> None:
    """``t += n / d`` for each triple, one fused kernel where torch has it."""
    if _foreach_addcdiv is not None:
        _foreach_addcdiv(tensors, numerators, denominators)
    else:
        for t, n, d in zip(tensors, numerators, denominators, strict=True):
            t.addcdiv_(n, d)


# --------------------------------------------------------------------------- the compiler


def compiler_reset() -> None:
    """Forget every compiled graph and guard (a fresh trace next time)."""
    reset = getattr(getattr(torch, "compiler", None), "reset", None)
    if reset is None:
        import torch._dynamo as dynamo

        reset = dynamo.reset
    reset()


def mark_static_address(tensor: torch.Tensor) -> None:
    """Tell the compiler that ``tensor`` keeps its address (CUDA graphs read it in place).
    No public API; a torch without it leaves the tensor unmarked (its CUDA graph may be skipped,
    which is then reported)."""
    import torch._dynamo as dynamo

    mark = getattr(dynamo, "mark_static_address", None)
    if mark is not None:
        mark(tensor)


@functools.cache
def _counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process (first compiles and recompiles)."""
    return _counters()["stats"]["unique_graphs"]


def cudagraph_skip_count() -> int:
    """Graphs whose CUDA-graph capture inductor skipped in this process."""
    return _counters()["inductor"]["cudagraph_skips"]


def compile_cache_hits() -> int:
    """Graphs loaded from inductor's FX graph cache or AOTAutograd's cache in this process (tests)."""
    counters = _counters()
    return counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]


def code_of(fn: Callable) -> Any | None:
    """The code object Dynamo compiles for ``fn`` (a function, a bound method, a callable object)."""
    for candidate in (fn, getattr(fn, "__func__", None), getattr(type(fn), "__call__", None)):  # noqa: B004 (the method, not a test)
        code = getattr(candidate, "__code__", None)
        if code is not None:
            return code
    return None


_COMPILE_ID = re.compile(r"^\s*\[?\d+/\d+\]?:\s*")


@functools.cache
def _guard_failures() -> dict | None:
    try:
        from torch._dynamo.utils import guard_failures
    except ImportError:
        return None
    return guard_failures


def recompile_reason_count(code: Any) -> int:
    """How many guard failures Dynamo has recorded for ``code`` (0 where this torch records none)."""
    failures = _guard_failures()
    return len(failures.get(code, ())) if failures is not None and code is not None else 0


def recompile_reasons(code: Any, start: int = 0) -> list[str]:
    """The guard failures recorded for ``code`` from index ``start`` on, newest compile first
    as Dynamo checks them (``"tensor 'x' size mismatch at index 0. expected 3, actual 4"``),
    without the compile ids that make equal reasons differ."""
    failures = _guard_failures()
    if failures is None or code is None:
        return []
    return [_COMPILE_ID.sub("", str(r)).strip() for r in list(failures.get(code, ()))[start:]]


def recompile_limit() -> int:
    """How many graphs Dynamo compiles for one function before it gives up on it."""
    config, key = _limit_config()
    return int(getattr(config, key))


def patch_recompile_limit(limit: int) -> Any:
    """A context manager with Dynamo's recompile limit set to ``limit`` (tests)."""
    config, key = _limit_config()
    return config.patch(**{key: limit})


def _limit_config() -> tuple[Any, str]:
    public = getattr(getattr(torch, "compiler", None), "config", None)
    if public is not None and hasattr(public, "recompile_limit"):
        return public, "recompile_limit"
    import torch._dynamo.config as dynamo_config

    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, key):
            return dynamo_config, key
    raise AttributeError("this torch has no Dynamo recompile limit")


@contextlib.contextmanager
def no_compile_cache() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache off for what compiles inside (those of
    them this torch has): a graph is compiled afresh rather than loaded from a cache entry."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with contextlib.ExitStack() as stack:
        for config, key in ((inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache")):
            if hasattr(config, key):
                stack.enter_context(config.patch(**{key: False}))
        yield


@functools.cache
def compile_errors() -> tuple[type[BaseException], ...]:
    """What a compiled call raises when compiling fails (not when the compiled code runs):
    Dynamo's errors, a graph break under ``fullgraph=True`` and the recompile limit among them."""
    import torch._dynamo.exc as exc

    found = [getattr(exc, name, None) for name in ("TorchDynamoException", "FailOnRecompileLimitHit")]
    return tuple(t for t in found if isinstance(t, type))


def compile_failure(error: BaseException) -> tuple[str, str]:
    """``(kind, reason)`` of a compile error: kind is ``"recompile limit"``, ``"graph break"``,
    ``"compiler failure"`` or ``"compile error"``; the reason is its first line and, where the
    error says, the user code it stopped at."""
    import torch._dynamo.exc as exc

    text = str(error)
    first = text.strip().splitlines()[0].strip() if text.strip() else type(error).__name__
    limit_hit = getattr(exc, "FailOnRecompileLimitHit", None)
    # torch before the dedicated exception raises Unsupported("cache_size_limit reached")
    if (limit_hit is not None and isinstance(error, limit_hit)) or re.search(r"(cache_size|recompile)_limit", first):
        return "recompile limit", first
    where = _user_code(text)
    reason = f"{first} at {where}" if where else first
    if isinstance(error, getattr(exc, "Unsupported", ())):
        return "graph break", reason
    if isinstance(error, getattr(exc, "BackendCompilerFailed", ())):
        return "compiler failure", reason
    return "compile error", reason


def _user_code(text: str) -> str:
    """``file.py:12 in fn``: the last frame of the ``from user code:`` part of a Dynamo error."""
    _, _, tail = text.partition("from user code:")
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', tail)
    if not frames:
        return ""
    path, line, fn = frames[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line} in {fn}"


class _Recorder(logging.Handler):
    """Keeps the latest warnings of a logger (a skip is a warning; with TORCH_LOGS the same
    logger also writes debug lines), and how many there were."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: collections.deque[str] = collections.deque(maxlen=32)
        self.total = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.total += 1


@functools.cache
def _cudagraph_skip_recorder() -> _Recorder | None:
    """A handler on the logger inductor writes "skipping cudagraphs due to …" to (found by the
    function that writes it), installed once; None where this torch has no such logger."""
    try:
        import torch._inductor.cudagraph_utils as cudagraph_utils
    except Exception:  # noqa: BLE001 - a build without inductor: nothing to watch
        return None
    if not hasattr(cudagraph_utils, "log_cudagraph_skip_and_bump_counter"):
        return None
    for name in ("cudagraphs_log", "perf_hint_log"):
        logger = getattr(cudagraph_utils, name, None)
        if isinstance(logger, logging.Logger):
            recorder = _Recorder()
            logger.addHandler(recorder)
            return recorder
    return None


def watch_cudagraph_skips() -> None:
    """Start recording why inductor skips CUDA graphs (call before compiling)."""
    _cudagraph_skip_recorder()


def cudagraph_skip_messages_seen() -> int:
    recorder = _cudagraph_skip_recorder()
    return recorder.total if recorder is not None else 0


def cudagraph_skip_messages(since: int) -> list[str]:
    """The skip messages recorded after the first ``since`` (the latest 32 at most)."""
    recorder = _cudagraph_skip_recorder()
    if recorder is None:
        return []
    new = recorder.total - since
    return list(recorder.messages)[-new:] if new > 0 else []
