"""torch's private APIs are named in ``ddprl/runtime/compat.py`` alone, and a compiled region
speaks up at run time: a graph break, a recompile, the recompile limit and (on CUDA) a skipped
CUDA graph are each logged once with the reason, and a region that cannot run compiled runs
its eager function with the same results (``ddprl.algos.graphs.Region``)."""

from __future__ import annotations

import ast
import logging
import re

import pytest
import torch
from conftest import REPO

from ddprl.algos.graphs import Region, compile_region
from ddprl.runtime import compat

# -- no module but compat.py names a private torch API ------------------------------------------------

COMPAT = REPO / "ddprl" / "runtime" / "compat.py"
COMPILED_ATTR = compat.COMPILED_PREFIX.rstrip(".")  # torch.compile's wrapper attribute
PRIVATE_PATH = re.compile(r"torch(?:\.\w+)*\._(?!_)\w*(?:\.\w+)*")  # a dotted path through a private torch name


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything else (a call, a subscript)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def private_torch_names(source: str) -> list[str]:
    """What ``source`` names of torch's private API: imports and attribute paths through a
    private torch module or function (aliases such as ``import torch.nn as nn`` followed),
    ``getattr``-style access with a private name, a string that is such a path, and
    ``torch.compile``'s wrapper attribute or state-dict prefix in any form."""
    tree = ast.parse(source)
    torch_aliases = {"torch": "torch"}  # local name -> torch module path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    if PRIVATE_PATH.fullmatch(a.name):
                        found.append(f"import {a.name}")
                    torch_aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith("torch."):
            for a in node.names:
                path = f"{node.module}.{a.name}"
                if PRIVATE_PATH.fullmatch(path):
                    found.append(f"from {node.module} import {a.name}")
                torch_aliases[a.asname or a.name] = path
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == COMPILED_ATTR:
                found.append(f".{COMPILED_ATTR}")
            parts = _dotted(node)
            if parts and parts[0] in torch_aliases and any(_private(p) for p in parts[1:]):
                found.append(".".join([torch_aliases[parts[0]], *parts[1:]]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
        ):
            target, name = _dotted(node.args[0]), node.args[1]
            if (
                target
                and target[0] in torch_aliases
                and isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _private(name.value)
            ):
                found.append(f"{node.func.id}({'.'.join(target)}, {name.value!r})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if PRIVATE_PATH.fullmatch(node.value.strip()) or COMPILED_ATTR in node.value:
                found.append(repr(node.value))
    return list(dict.fromkeys(found))  # a path is seen once per attribute along it


def test_the_scan_finds_every_form_of_a_private_name():
    """The scanner itself: each line below names a private torch API one way, and is found."""
    lines = [
        "import torch._dynamo",
        "import torch.distributed._functional_collectives as funcol",
        "from torch._dynamo.utils import counters",
        "from torch.distributed import _functional_collectives",
        "torch._foreach_sub_(a, b)",
        "torch._dynamo.config.patch(error_on_recompile=True)",
        "import torch.nn as nn\nnn.modules._private",
        "getattr(torch, '_foreach_sub_')",
        "logging.getLogger('torch._inductor.cudagraph_utils')",
        f"m.{COMPILED_ATTR}",
        f"k.startswith({compat.COMPILED_PREFIX!r})",
    ]
    for line in lines:
        assert private_torch_names(line), line
    public = [
        "import torch",
        "torch.__version__",
        "torch.compiler.reset()",
        "torch.nn.functional.relu(x)",
        "from torch.func import functional_call",
        "x._private",
        "doc = 'torch._dynamo is private, a sentence says'",
        "import torch.distributed as dist\ndist.all_reduce(t)",
    ]
    for line in public:
        assert not private_torch_names(line), line


def test_no_module_but_compat_names_a_private_torch_api():
    sources = [p for folder in ("ddprl", "tests", "benchmarks", "scripts") for p in (REPO / folder).rglob("*.py")]
    assert COMPAT in sources and len(sources) > 50
    offenders = {
        str(p.relative_to(REPO)): names
        for p in sources
        if p != COMPAT
        for names in [private_torch_names(p.read_text())]
        if names
    }
    assert offenders == {}
    assert private_torch_names(COMPAT.read_text())  # the scan sees them where they are


# -- compiled regions speak up --------------------------------------------------------------------------


@pytest.fixture
def ddprl_log():
    """The ``ddprl`` logger's records as (level, message), at INFO (the launcher's rank-0 level)."""
    lines: list[tuple[str, str]] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append((record.levelname, record.getMessage()))
    logger = logging.getLogger("ddprl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    compat.compiler_reset()  # no graphs cached from an earlier test: each region compiles afresh
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def branchy(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # a Python branch on a tensor's value: not one graph
        return x * 2
    return x - 1


def affine(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_a_graph_break_is_reported_once_and_the_region_runs_eagerly(ddprl_log):
    region = compile_region(branchy, torch.device("cpu"), name="branchy")
    for x in (torch.ones(3), -torch.ones(3), torch.ones(4)):
        assert torch.equal(region(x), branchy(x))
    assert region.eager and region.graphs == 0
    assert len(ddprl_log) == 1, ddprl_log
    level, line = ddprl_log[0]
    assert level == "WARNING"
    assert re.fullmatch(
        r"compile=true: region branchy: graph break \(.+ at test_compat\.py:\d+ in branchy\); "
        r"it runs eagerly from now on",
        line,
    ), line


@pytest.mark.slow
def test_recompiles_are_reported_and_past_the_limit_the_region_runs_eagerly(ddprl_log):
    """Dynamo's recompile limit lowered to 2: a new shape compiles a second graph (INFO with
    the guard that failed, once however often it is used), a third shape is past the limit
    (WARNING; eager from then on, with the same results)."""
    region = compile_region(affine, torch.device("cpu"), name="affine")
    with compat.patch_recompile_limit(2):
        for n in (3, 4, 3, 4, 5, 6, 3):
            x = torch.arange(n, dtype=torch.float32)
            assert torch.equal(region(x), affine(x))
            assert region.eager == (n in (5, 6) or region.eager)
    assert region.graphs == 2 and region.eager
    assert [level for level, _ in ddprl_log] == ["INFO", "WARNING"], ddprl_log
    x = r"tensor '(x|L\['x'\])' size mismatch at index 0"  # how Dynamo names the argument differs by version
    assert re.fullmatch(
        rf"compile=true: region affine: recompiled \({x}. expected 3, actual 4\); 2 graphs", ddprl_log[0][1]
    ), ddprl_log
    assert re.fullmatch(
        rf"compile=true: region affine: recompile limit \(2 graphs, the next for {x}. expected 4, "
        r"actual 5\); it runs eagerly from now on",
        ddprl_log[1][1],
    ), ddprl_log


def test_a_region_within_its_graphs_says_nothing(ddprl_log):
    region = compile_region(affine, torch.device("cpu"), name="affine")
    for _ in range(3):
        region(torch.ones(2))
    assert (region.graphs, region.eager, ddprl_log) == (1, False, [])


def test_a_skipped_cuda_graph_is_reported_once_and_the_region_stays_compiled(ddprl_log):
    """CUDA graphs asked of a CPU region (what a region on one GPU asks): inductor skips the
    capture; the region says so once and keeps its compiled kernels. The reason inductor gives
    on CUDA is checked by the gpu test below."""
    region = Region(affine, mode="reduce-overhead", name="affine")
    for _ in range(3):
        assert torch.equal(region(torch.ones(3)), affine(torch.ones(3)))
    assert (region.graphs, region.eager) == (1, False)
    assert ddprl_log == [
        ("WARNING", "compile=true: region affine: CUDA graph skipped (no reason recorded); its kernels run without one")
    ]


def test_a_training_region_with_cuda_graphs_is_compiled_afresh_not_loaded_from_the_compile_caches(ddprl_log):
    """``compile_cache=False`` (the update regions; Region's docstring says what was measured on
    an H100): with CUDA graphs asked, a region compiled again after a reset reads neither of
    torch's compile caches, where a region with them on loads its graph from there."""

    def cache_hits(compile_cache: bool) -> int:
        compat.compiler_reset()
        before = compat.compile_cache_hits()
        region = Region(affine, mode="reduce-overhead", name="affine", compile_cache=compile_cache)
        assert torch.equal(region(torch.ones(3)), affine(torch.ones(3)))
        assert region.graphs == 1 and not region.eager
        return compat.compile_cache_hits() - before

    cache_hits(True)  # the caches hold affine's graph from here on
    assert cache_hits(True) > 0
    assert cache_hits(False) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_skipped_cuda_graph_is_reported_once_with_the_reason(ddprl_log):
    """A region that mutates an input not marked static cannot be a CUDA graph: inductor skips
    the capture, the region says why once and stays compiled, with the eager results."""

    def accumulate(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        total.add_(x)
        return total * 2

    region = compile_region(accumulate, torch.device("cuda"), name="accumulate")
    assert region.mode == "reduce-overhead"
    x = torch.arange(4.0, device="cuda")
    total, reference = torch.zeros(4, device="cuda"), torch.zeros(4, device="cuda")
    for _ in range(4):
        out = region(x, total).clone()
        assert torch.equal(out, accumulate(x, reference))
    assert torch.equal(total, reference) and region.graphs == 1 and not region.eager
    assert [level for level, _ in ddprl_log] == ["WARNING"], ddprl_log
    assert re.fullmatch(
        r"compile=true: region accumulate: CUDA graph skipped \(skipping cudagraphs due to .+\); "
        r"its kernels run without one",
        ddprl_log[0][1],
    ), ddprl_log
