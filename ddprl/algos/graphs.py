"""Compiled regions: one function of tensors compiled whole, and the checks that keep it whole.

A *region* is a hot function (TD-MPC2's update or plan, PPO's rollout or minibatch step)
written so that ``torch.compile(fullgraph=True)`` captures it as ONE graph: static shapes, no
``.item()``/``.cpu()``/``.tolist()``, no Python branch on a tensor's value, randomness drawn
as inputs or from the global generator. On CUDA such a graph is replayed as a CUDA graph
(``mode="reduce-overhead"``): one launch instead of hundreds of kernels, which is what a
small model acting every step is limited by. On the CPU the same code compiles the same way
(CI checks it there: :func:`capture_graphs`, :func:`host_syncs`).

A CUDA graph's outputs live in memory the next replay overwrites: callers :func:`keep` what
they hold on to across calls.

At run time a region speaks up (:class:`Region`): a graph break, a recompile, the recompile
limit or a skipped CUDA graph is logged once per reason, and a region that cannot run compiled
runs its eager function from then on (docs/distributed.md, "Compiled regions at run time").
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from ddprl.runtime import compat

log = logging.getLogger("ddprl")

# Tensor methods that wait for the device (or leave it): none may appear inside a region.
_SYNC_METHODS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "nonzero"}


def region_mode(device: torch.device, world_size: int = 1) -> str | None:
    """The ``torch.compile`` mode of a region on ``device``: CUDA graphs on one CUDA device.

    With several ranks the region holds collectives: NCCL inside a captured CUDA graph is
    left out until measured (docs/benchmarks.md), so those regions compile without graphs.
    """
    if device.type == "cuda" and world_size == 1:
        return "reduce-overhead"
    return None


def compile_region(
    fn: Callable, device: torch.device, world_size: int = 1, name: str | None = None, compile_cache: bool = True
) -> Region:
    """``fn`` compiled whole (``fullgraph=True``: a graph break is not a silent slowdown), as a
    :class:`Region` that reports what the compiler did not do and falls back to ``fn``.
    ``compile_cache=False``: see :class:`Region`."""
    return Region(fn, region_mode(device, world_size), name, compile_cache)


class Region:
    """A function compiled whole that says when it is not.

    Called like ``fn``. Each call checks what compiling it did (counters read around the call:
    no host sync, a few dictionary reads) and logs through ``logging.getLogger("ddprl")``, once
    per region and reason:

    - a new graph after the first (a recompile: a new shape, a new flag value): INFO with
      Dynamo's guard failure; the region stays compiled;
    - a graph break, the recompile limit, a compiler failure: WARNING, and the region runs
      ``fn`` eagerly from then on. Compiling fails before the graph runs, so the eager call
      that follows computes the same step (the compiled and eager forms agree: tests);
    - a CUDA graph skipped (``mode="reduce-overhead"``): WARNING with inductor's reason; the
      region stays compiled, its kernels launched one by one.

    :attr:`graphs` counts the graphs compiled for this region, :attr:`eager` says whether it
    fell back.

    ``compile_cache=False`` (training steps): with CUDA graphs, the region is compiled afresh in
    every process instead of loaded from torch's compile caches (inductor's FX graph cache,
    AOTAutograd's cache); its first graph, that is: a recompile may load from them. Measured on
    an H100 with torch 2.11: TD-MPC2's update region ran 24 ms a call when loaded from a warm
    cache against 2.6-3.1 ms compiled afresh, no warning raised (docs/benchmarks.md). The price
    is the compile time on every start.
    """

    def __init__(self, fn: Callable, mode: str | None = None, name: str | None = None, compile_cache: bool = True):
        self.fn, self.mode = fn, mode
        # the caches are left on where no CUDA graph is recorded: nothing was measured against them there
        self._compile_afresh = not compile_cache and mode == "reduce-overhead"
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self.compiled = torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)
        self.eager = False
        self.graphs = 0
        self._code = compat.code_of(fn)
        self._reported: set[tuple[str, str]] = set()
        if mode == "reduce-overhead":
            compat.watch_cudagraph_skips()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.eager:
            return self.fn(*args, **kwargs)
        graphs, skips = compat.graphs_compiled(), compat.cudagraph_skip_count()
        reasons, skip_messages = compat.recompile_reason_count(self._code), compat.cudagraph_skip_messages_seen()
        # Only around the first call, which compiles the first graph: around every call the
        # switch cost ~190 us a call on the 2-core CPU (272 against 82 us for a tiny region), and
        # a region's later graphs are rare recompiles.
        afresh, self._compile_afresh = self._compile_afresh, False
        try:
            with compat.no_compile_cache() if afresh else contextlib.nullcontext():
                out = self.compiled(*args, **kwargs)
        except compat.compile_errors() as e:
            kind, reason = compat.compile_failure(e)
            if kind == "recompile limit":
                last = compat.recompile_reasons(self._code, reasons)
                reason = f"{compat.recompile_limit()} graphs" + (f", the next for {last[0]}" if last else "")
            self._report(logging.WARNING, kind, reason, "; it runs eagerly from now on")
            self.eager = True
            return self.fn(*args, **kwargs)
        new = compat.graphs_compiled() - graphs
        if new > 0:
            if self.graphs:  # the first graph is the compile that was asked for
                why = compat.recompile_reasons(self._code, reasons)
                self._report(
                    logging.INFO, "recompiled", why[0] if why else "no reason recorded", f"; {self.graphs + new} graphs"
                )
            self.graphs += new
        if compat.cudagraph_skip_count() > skips:
            why = compat.cudagraph_skip_messages(skip_messages)
            # inductor's message is "skipping cudagraphs due to <reason>. Found from: <stack>"
            reason = why[-1].strip().splitlines()[0].split(". Found from")[0] if why else "no reason recorded"
            self._report(logging.WARNING, "CUDA graph skipped", reason, "; its kernels run without one")
        return out

    def _report(self, level: int, what: str, reason: str, then: str) -> None:
        """One log line per region, kind and reason."""
        if (what, reason) not in self._reported:
            self._reported.add((what, reason))
            log.log(level, "compile=true: region %s: %s (%s)%s", self.name, what, reason, then)


@functools.cache
def training_step_unsupported() -> str | None:
    """Why this torch cannot compile a training step whole (None when it can).

    Feature detection, not a version table: Dynamo traces a tiny ``torch.func.grad`` of a
    module through ``functional_call`` (what every update region does), graph only, no code
    generated. torch 2.4 cannot (``NNModuleVariable``); 2.13 can.
    """
    layer = torch.nn.Linear(2, 1)

    def step(x: torch.Tensor) -> torch.Tensor:
        def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(layer, params, (x,)).sum()

        return torch.func.grad(loss)(dict(layer.named_parameters()))["weight"]

    try:
        torch.compile(step, backend=lambda gm, inputs: gm.forward, fullgraph=True)(torch.ones(3, 2))
    except Exception as e:  # noqa: BLE001 - whatever Dynamo raises, the answer is "cannot"
        return (
            f"torch {torch.__version__} cannot compile a training step as one graph "
            f"({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
        )
    return None


def mark_static(*tensors: torch.Tensor) -> None:
    """Fixed addresses for CUDA graphs: tensors a region reads (and writes) in place, never
    copied in per replay. A CUDA graph skips capture when a region mutates an input that is
    not static (optimizer state, buffers kept outside modules)."""
    for t in tensors:
        compat.mark_static_address(t)


def step_begin(device: torch.device) -> None:
    """Tell CUDA-graph trees that a new iteration starts (outputs of the previous may be reused)."""
    if device.type == "cuda" and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
        torch.compiler.cudagraph_mark_step_begin()


def keep(x: Any) -> Any:
    """A copy of a region's output that the next replay cannot overwrite (tensors in any nesting)."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: keep(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # NamedTuple
        return type(x)(*(keep(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(keep(v) for v in x)
    return x


# --------------------------------------------------------------------------- checks (tests, doctor)


def capture_graphs(fn: Callable, *args: Any, **kwargs: Any) -> list[torch.fx.GraphModule]:
    """Compile ``fn`` with ``fullgraph=True`` and a recording backend, call it once, return the
    FX graphs Dynamo produced. Raises (Dynamo's ``Unsupported``) on any graph break:
    ``.item()``, a Python branch on a tensor, an unsupported call."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        graphs.append(gm)
        return gm.forward

    compat.compiler_reset()  # a fresh trace, not a cached one from an earlier call
    try:
        torch.compile(fn, backend=record, fullgraph=True, dynamic=False)(*args, **kwargs)
    finally:
        compat.compiler_reset()
    return graphs


def host_syncs(graphs: list[torch.fx.GraphModule]) -> list[str]:
    """The nodes of ``graphs`` (subgraphs included) that copy to the host or read a value there."""
    found = []
    for graph_module in graphs:
        for module in graph_module.modules():
            graph = getattr(module, "graph", None)
            if not isinstance(graph, torch.fx.Graph):
                continue
            for node in graph.nodes:
                if node.op == "call_method" and node.target in _SYNC_METHODS:
                    found.append(f"{node.target} ({node.name})")
                elif node.op in ("call_method", "call_function") and _to_host(node):
                    found.append(f"{node.target} to the CPU ({node.name})")
    return found


def _to_host(node: torch.fx.Node) -> bool:
    """A ``.to(...)``/``copy`` call whose destination is the CPU (or a NumPy conversion)."""
    target = getattr(node.target, "__name__", node.target)
    if target not in ("to", "_to_copy", "copy", "new_tensor"):
        return False
    values = list(node.args[1:]) + list(node.kwargs.values())
    for v in values:
        if isinstance(v, torch.device) and v.type == "cpu":
            return True
        if isinstance(v, str) and v.split(":")[0] == "cpu":
            return True
    return False


# --------------------------------------------------------------------------- an optimizer step inside a region
#
# ``torch.optim.Optimizer.step`` breaks the graph on purpose (its ``_use_grad`` wrapper), and
# ``loss.backward()`` does too: a region computes gradients with ``torch.func.grad_and_value``
# and applies Adam with :class:`FlatAdam`, on the state of an ordinary ``torch.optim.Adam``
# (so checkpoints keep its ``state_dict`` format and load into eager code alike).


def grad_with_aux(fn: Callable, functional: bool) -> Callable:
    """``fn(params: dict, *args) -> (loss, aux)`` to ``g(params, *args) -> (grads: dict, aux)``.

    ``functional``: ``torch.func.grad``, which Dynamo traces into a region. Otherwise plain
    ``torch.autograd.grad`` on the same function: the same numbers for eager code, without
    the per-op cost of the functorch transform (measured: a small TD-MPC2 update on a CPU,
    38 ms with ``torch.func.grad`` against 23 ms with autograd).
    """
    if functional:
        return torch.func.grad(fn, has_aux=True)

    def eager(params: dict[str, torch.Tensor], *args: Any) -> tuple[dict[str, torch.Tensor], Any]:
        with torch.enable_grad():
            loss, aux = fn(params, *args)
            grads = torch.autograd.grad(loss, list(params.values()))
        return dict(zip(params, grads)), aux

    return eager


class FlatAdam:
    """Adam (Kingma & Ba) in place, the arithmetic of ``torch.optim.Adam``, on the state of an
    ordinary ``torch.optim.Adam`` re-homed into ONE flat buffer per param group.

    Why flat: a region's compile time grows with its graph. Adam on per-parameter tensors is
    ~10 ops per parameter (TD-MPC2: 50 parameters, ~40 s of a ~95 s update compile on a CPU);
    on flat buffers a step is ~10 ops per group plus one fused addcdiv over the parameters.
    ``optimizer.state`` keeps one entry per parameter, now views of the flat buffers, so its
    ``state_dict`` (checkpoints) has the usual format, and a plain ``torch.optim.Adam`` loads
    it; a loaded checkpoint's state is copied in here. ``step`` stays a 0-d tensor per
    parameter (a view of the group's step vector) on the parameters' device: a CPU scalar
    would keep a CUDA graph from being captured, and a host read of it would sync.

    ``lr_tensors``: the learning rates as device tensors that :meth:`sync_lr` refreshes from
    ``optimizer.param_groups`` (annealing without recompiling); otherwise constants.

    Gradients travel as ONE flat tensor over every group (:meth:`flatten`): micro-batches add
    up, ranks average it and the norm clip scales it as one tensor each.

    >>> w = torch.nn.Parameter(torch.ones(3))
    >>> adam = FlatAdam(torch.optim.Adam([w], lr=0.1))
    >>> adam.step_(adam.flatten([torch.ones(3)]))
    >>> w.data
    tensor([0.9000, 0.9000, 0.9000])
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_tensors: bool = False):
        self.optimizer = optimizer
        self.params: list[torch.Tensor] = []  # every group's, in order: gradients come in this order
        self.groups: list[dict[str, Any]] = []
        for group in optimizer.param_groups:
            if group.get("amsgrad") or group.get("weight_decay") or group.get("maximize"):
                raise ValueError("FlatAdam: only plain Adam (no amsgrad, weight_decay, maximize) runs in a region")
            params = list(group["params"])
            if len({(p.device, p.dtype) for p in params}) != 1:
                raise ValueError("FlatAdam: the parameters of a group need one device and one dtype")
            like = params[0]
            sizes = [p.numel() for p in params]
            step = torch.zeros(len(params), dtype=torch.float32, device=like.device)
            exp_avg = torch.zeros(sum(sizes), dtype=like.dtype, device=like.device)
            exp_avg_sq = torch.zeros_like(exp_avg)
            offset = 0
            for i, (p, n) in enumerate(zip(params, sizes)):
                old = optimizer.state.get(p)
                if old:  # a checkpoint's state (or an eager step's): same values, new home
                    step[i] = float(old["step"])
                    exp_avg[offset : offset + n].copy_(old["exp_avg"].reshape(-1))
                    exp_avg_sq[offset : offset + n].copy_(old["exp_avg_sq"].reshape(-1))
                optimizer.state[p] = {
                    "step": step[i],
                    "exp_avg": exp_avg[offset : offset + n].view_as(p),
                    "exp_avg_sq": exp_avg_sq[offset : offset + n].view_as(p),
                }
                offset += n
            lr = torch.tensor(float(group["lr"]), device=like.device) if lr_tensors else group["lr"]
            self.groups.append(
                {
                    "params": params,
                    "sizes": sizes,
                    "step": step,
                    "exp_avg": exp_avg,
                    "exp_avg_sq": exp_avg_sq,
                    "lr": lr,
                    "betas": group["betas"],
                    "eps": group["eps"],
                }
            )
            self.params += params

    def tensors(self) -> list[torch.Tensor]:
        """What a step updates in place besides the parameters (to mark static for CUDA graphs)."""
        return [
            g[k] for g in self.groups for k in ("step", "exp_avg", "exp_avg_sq", "lr") if isinstance(g[k], torch.Tensor)
        ]

    def sync_lr(self) -> None:
        """Copy each param group's (annealed) ``lr`` into the tensor a region reads."""
        for flat, group in zip(self.groups, self.optimizer.param_groups):
            flat["lr"].fill_(float(group["lr"]))

    def flatten(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Gradients in :attr:`params` order -> one flat tensor (the groups one after another)."""
        if len(grads) != len(self.params):
            raise ValueError(f"FlatAdam: {len(grads)} gradients for {len(self.params)} parameters")
        return torch.cat([g.reshape(-1) for g in grads])

    def step_(self, flat_grad: torch.Tensor) -> None:
        """One Adam step from a :meth:`flatten`'d gradient (clipped or averaged as it is).
        Bias corrections are tensors: no host read of ``step``."""
        with torch.no_grad():
            for group, g in zip(self.groups, flat_grad.split([g["exp_avg"].numel() for g in self.groups])):
                beta1, beta2 = group["betas"]
                exp_avg, exp_avg_sq = group["exp_avg"], group["exp_avg_sq"]
                group["step"].add_(1)
                t = group["step"][0]  # the params of a group always step together
                exp_avg.lerp_(g, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                # p += m / denom with denom = (sqrt(v) / sqrt(1 - beta2^t) + eps) / -step_size,
                # step_size = lr / (1 - beta1^t): torch.optim.Adam's arithmetic (capturable form),
                # in place on ONE temporary: on a CPU a step of a large net is memory passes.
                step_size_neg = -(group["lr"] / (1 - torch.pow(beta1, t)))
                bias2_sqrt = (1 - torch.pow(beta2, t)).sqrt()
                denom = exp_avg_sq.sqrt().div_(bias2_sqrt * step_size_neg).add_(group["eps"] / step_size_neg)
                sizes = group["sizes"]
                compat.foreach_addcdiv_(
                    group["params"],
                    [m.view_as(p) for m, p in zip(exp_avg.split(sizes), group["params"])],
                    [d.view_as(p) for d, p in zip(denom.split(sizes), group["params"])],
                )

    def averaged_step_(
        self,
        local_grad: torch.Tensor,
        mean: Callable[[torch.Tensor], torch.Tensor],
        max_norm: float,
        unscale: Callable[[torch.Tensor], bool] | None = None,
    ) -> torch.Tensor | None:
        """The optimizer step every rank takes alike, what DDP + ``clip_grad_norm_`` + ``step()``
        do, written as tensor ops so that it can sit inside a compiled region.

        ``local_grad``: this rank's :meth:`flatten`'d gradient (micro-batches already summed and
        scaled); ``mean``: the mean over ranks, ONE all-reduce (``rt.region_mean``); then the
        norm clip (``max_norm`` > 0) and Adam. ``unscale`` (fp16): divides the averaged gradient
        by the loss scale in place and says whether it is finite; a step that is not is skipped
        (every rank decides alike: the gradient is already averaged). Returns the norm before
        clipping, or None without a clip.
        """
        grad = mean(local_grad)
        finite = unscale is None or unscale(grad)
        norm = None
        if max_norm > 0:
            grad, norm = clip_grad(grad, max_norm)
        if finite:
            self.step_(grad)
        return norm


def clip_grad(flat_grad: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale a flat gradient to a 2-norm of at most ``max_norm`` (``clip_grad_norm_``'s rule);
    returns the scaled gradient and the norm before clipping (a device tensor)."""
    total = torch.linalg.vector_norm(flat_grad.float())
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    return flat_grad * coef.to(flat_grad.dtype), total
