"""Mutation testing of the code where a one-line bug changes what is learned, not whether it runs.

Each mutant is one small, realistic edit of one function (an operator swapped, a constant moved by
one, a keyword argument dropped, a call left out, a condition inverted, ``mean`` for ``sum``). The
script applies one mutant at a time to a copy of the package, runs the fast tests that cover that
function, and counts the mutant killed when they fail (or time out). A survivor is either a missing
test or a mutant that cannot change behaviour: the latter are listed in ``EQUIVALENT`` with the
reason, and left out of the kill rate.

    python scripts/mutation.py --list                       # the mutants, one line each
    python scripts/mutation.py --jobs 2                     # run them all; report in mutation-report.json
    python scripts/mutation.py --only normalize --jobs 2    # the targets whose name contains "normalize"
    python scripts/mutation.py --resume                     # go on from the report, rerunning nothing done
    python scripts/mutation.py --survivors                  # only the report's survivors (after new tests)
    python scripts/mutation.py --sample 300 --seed 1        # an estimate from 300 mutants drawn at random
    python scripts/mutation.py --show ID                    # the mutated function of one mutant

The report (``--report``, default ``mutation-report.json``) holds every mutant's outcome; the last
lines printed are the kill rate per target and overall (docs/architecture.md, "Mutation testing").
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    """Functions of one module (``qualname``: ``f`` or ``Class.method``) and the fast tests that guard them."""

    name: str
    path: str
    functions: tuple[str, ...]
    tests: tuple[str, ...]


# What the fast suite must guard: the algorithms' math, the cross-rank reductions and their callers,
# schedules, and checkpoint/resume. Tests are pytest node ids or files, run with ``-x``.
UNITS_PPO = "tests/test_ppo_units.py"
DDP_PPO = (
    "tests/test_ddp_equivalence.py::test_two_ranks_apply_the_gradient_of_one_process_on_the_whole_batch",
    "tests/test_ddp_equivalence.py::test_grad_clipping_under_ddp_equals_one_process",
    "tests/test_ddp_equivalence.py::test_target_kl_global_decision_no_deadlock",
)
LOOP_PPO = "tests/test_ppo_loop.py"
TDMPC2 = ("tests/test_tdmpc2_pieces.py", "tests/test_tdmpc2_loop.py")

TARGETS: tuple[Target, ...] = (
    Target("ppo.loss", "ddprl/algos/ppo/loss.py", ("ppo_loss", "standardize"), (UNITS_PPO, *DDP_PPO)),
    Target("ppo.gae", "ddprl/algos/ppo/rollout.py", ("compute_gae",), (UNITS_PPO,)),
    Target(
        "ppo.update",
        "ddprl/algos/ppo/update.py",
        ("UpdateStep.step_eager", "UpdateStep.loss", "learn"),
        (UNITS_PPO, *DDP_PPO, LOOP_PPO),
    ),
    Target(
        "ppo.loop",
        "ddprl/algos/ppo/loop.py",
        ("advantages_and_returns", "iteration_metrics", "train"),
        (UNITS_PPO, LOOP_PPO),
    ),
    Target(
        "normalize",
        "ddprl/normalize.py",
        (
            "RunningMeanStd.update",
            "RunningMeanStd.moments",
            "RunningMeanStd.update_from_moments",
            "RunningMeanStd.normalize",
            "ReturnScaler.track",
            "ReturnScaler.update",
            "ReturnScaler.scale",
        ),
        (
            UNITS_PPO,
            "tests/test_obs_spaces.py::test_norm_obs_rescales_box_columns_only_and_saves_what_it_always_saved",
            "tests/test_runtime.py::test_running_stats_identical_across_ranks_and_exact",
            LOOP_PPO,
        ),
    ),
    Target(
        "flat_adam",
        "ddprl/algos/graphs.py",
        ("FlatAdam.step_", "FlatAdam.averaged_step_", "FlatAdam.sync_lr", "clip_grad"),
        ("tests/test_flat_adam.py", *DDP_PPO, LOOP_PPO),
    ),
    Target(
        "collectives",
        "ddprl/runtime/collectives.py",
        (
            "Runtime.all_reduce_sum",
            "Runtime.all_reduce_mean",
            "Runtime._reduce",
            "Runtime.region_mean",
            "Runtime.region_all_gather",
            "Runtime._bucket_mean_hook",
            "Runtime.check_in_sync",
            "parameter_checksum",
        ),
        (
            "tests/test_runtime.py::test_collectives_two_ranks",
            "tests/test_runtime.py::test_check_in_sync_catches_drift_and_wrap_broadcasts",
            "tests/test_runtime.py::test_running_stats_identical_across_ranks_and_exact",
            *DDP_PPO,
            "tests/test_qmix_ddp.py",
            "tests/test_tdmpc2_loop.py::test_targets_and_scale_identical_on_all_ranks_after_updates",
        ),
    ),
    Target(
        "seeding",
        "ddprl/runtime/seeding.py",
        ("derive_seed", "env_seed", "Seeds.env", "Seeds.torch", "Seeds.shared", "Seeds.eval_actions"),
        (
            "tests/test_contract.py::test_seeds_fresh_and_resumed",
            "tests/test_contract.py::test_derived_seeds_never_repeat_across_seeds_ranks_purposes_and_steps",
            "tests/test_contract.py::test_evaluation_episodes_are_a_runs_own_and_the_same_at_every_evaluation",
            "tests/test_contract.py::test_tdmpc2_resume_reseeds_envs",
            "tests/test_contract.py::test_ppo_on_dmc_resume_reseeds_envs",
            "tests/test_runtime.py::test_env_seeds_distinct_per_rank",
            LOOP_PPO,
        ),
    ),
    Target(
        "tdmpc2.math",
        "ddprl/algos/tdmpc2/math.py",
        (
            "symlog",
            "symexp",
            "two_hot",
            "two_hot_inv",
            "soft_ce",
            "squash_log_std",
            "gaussian_log_prob",
            "tanh_log_det_jacobian",
            "squashed_gaussian_sample",
            "RunningScale.percentile_range",
            "RunningScale.update",
            "RunningScale.forward",
            "discount_for_episode_length",
        ),
        TDMPC2,
    ),
    Target("tdmpc2.loss", "ddprl/algos/tdmpc2/loss.py", ("rho_weights", "world_model_loss", "policy_loss"), TDMPC2),
    Target(
        "tdmpc2.model",
        "ddprl/algos/tdmpc2/networks.py",
        ("WorldModel.td_target", "WorldModel.soft_update_target", "WorldModel.forward", "QEnsemble.forward"),
        TDMPC2,
    ),
    Target("tdmpc2.learner", "ddprl/algos/tdmpc2/learner.py", ("UpdateStep.__call__", "build_learner"), TDMPC2),
    Target(
        "tdmpc2.schedule",
        "ddprl/algos/tdmpc2/schedule.py",
        (
            "Schedule.for_run",
            "Schedule.done",
            "Schedule.acts_randomly",
            "Schedule.advance",
            "Schedule.may_start_learning",
            "Schedule.start_learning",
            "Schedule.take_updates",
            "Schedule.log_due",
            "Schedule.eval_due",
            "Schedule.checkpoint_due",
        ),
        ("tests/test_tdmpc2_schedule.py",),
    ),
    Target(
        "qmix.learner",
        "ddprl/algos/qmix/learner.py",
        ("epsilon_at", "lambda_returns", "episode_ends", "QLearner.loss_terms", "QLearner.update"),
        ("tests/test_qmix_units.py", "tests/test_qmix_ddp.py"),
    ),
    Target(
        "qmix.loop",
        "ddprl/algos/qmix/loop.py",
        ("exploration", "train_metrics"),
        (
            "tests/test_qmix_units.py",
            "tests/test_qmix_train.py::test_exploration_and_updates_follow_the_global_step",
            "tests/test_qmix_train.py::test_resume_continues_the_counters",
        ),
    ),
    Target(
        "qmix.mixer",
        "ddprl/algos/qmix/networks.py",
        ("QMixer.forward", "VDNMixer.forward"),
        ("tests/test_qmix_units.py", "tests/test_qmix_ddp.py"),
    ),
    Target(
        "supervised",
        "ddprl/supervised/metrics.py",
        ("accuracy", "mse", "mae", "evaluate"),
        ("tests/test_supervised.py",),
    ),
    Target(
        "early_stopping",
        "ddprl/supervised/early_stopping.py",
        ("EarlyStopping.improves", "EarlyStopping.update"),
        (
            "tests/test_supervised.py::test_early_stopping_counts_validations_without_improvement",
            "tests/test_supervised.py::test_early_stopping_is_global_and_the_same_on_every_rank",
        ),
    ),
    Target(
        "checkpoint",
        "ddprl/checkpoint.py",
        ("strip_prefixes", "state_of", "rng_state", "set_rng_state", "Checkpointer.drop_after"),
        ("tests/test_contract.py", "tests/test_train_e2e.py", "tests/test_supervised.py", LOOP_PPO),
    ),
    Target("schedules", "ddprl/algos/common.py", ("crossed",), (UNITS_PPO, LOOP_PPO)),
    Target(
        "qmix.reconstruct",
        "ddprl/algos/qmix/reconstruct.py",
        (
            "VectorQuantizer.nearest",
            "VectorQuantizer.commitment_loss",
            "VectorQuantizer.forward",
            "VectorQuantizer.statistics",
            "VectorQuantizer.ema_update",
            "VectorQuantizer.dead",
            "VectorQuantizer.revive",
            "codebook_stats",
            "Tokenizer.forward",
            "reconstruction_error",
            "MaskedTokenPredictor.forward",
            "mask_positions",
            "masked_cross_entropy",
            "typewise_hungarian_loss",
            "Reconstructer.predict_nodes",
            "Reconstructer.forward",
        ),
        ("tests/test_reconstruct.py", "tests/test_graph_stage_ddp.py"),
    ),
    Target(
        "qmix.graph_stages",
        "ddprl/algos/qmix/graph_stages.py",
        (
            "node_squared_error",
            "TokenizerStage._reconstruct",
            "TokenizerStage.loss",
            "TokenizerStage.after_step",
            "MaskPredictorStage.loss",
        ),
        ("tests/test_graph_stages.py", "tests/test_graph_stage_ddp.py"),
    ),
    Target(
        "qmix.pretrain",
        "ddprl/algos/qmix/pretrain.py",
        ("StageLearner.update",),
        ("tests/test_graph_stages.py", "tests/test_graph_stage_ddp.py"),
    ),
)

# Mutants that cannot change what the code computes (id -> why). Left out of the kill rate.
EQUIVALENT: dict[str, str] = {
    "qmix.reconstruct:VectorQuantizer.nearest:unary:1": "the codebook is 2-D: dim 1 is dim -1",
    "qmix.reconstruct:VectorQuantizer.nearest:unary:3": "the distances are 2-D: dim 1 is dim -1",
    "qmix.reconstruct:VectorQuantizer.commitment_loss:unary:16": "z is 2-D: shape[1] is shape[-1]",
    "qmix.reconstruct:VectorQuantizer.statistics:drop_kwarg:2": "on the CPU the default device is z's",
    "qmix.reconstruct:typewise_hungarian_loss:compare:2": "on the CPU match_np shares match's memory (a GPU: not)",
    "qmix.reconstruct:typewise_hungarian_loss:negate:0": "on the CPU match_np shares match's memory (a GPU: not)",
    "qmix.reconstruct:typewise_hungarian_loss:compare:19": "a node alone of its type is matched to itself either way",
    "qmix.reconstruct:typewise_hungarian_loss:constant:27": "a node alone of its type is matched to itself either way",
    "qmix.reconstruct:typewise_hungarian_loss:unary:31": "sel is 2-D: dim 1 is dim -1",
    "qmix.reconstruct:typewise_hungarian_loss:drop_kwarg:17": "on the CPU the default device is the targets'",
    "qmix.reconstruct:mask_positions:constant:4": "any fill above 1 ranks the undrawable nodes after every draw",
    "qmix.reconstruct:mask_positions:drop_kwarg:8": "on the CPU the default device is visible's",
    "qmix.reconstruct:MaskedTokenPredictor.forward:binop:0": "a learned embedding, symmetric at init, either sign",
    "qmix.reconstruct:MaskedTokenPredictor.forward:binop:2": "a learned embedding, symmetric at init, either sign",
    "qmix.graph_stages:node_squared_error:unary:4": "the feature mask is 2-D: dim 1 is dim -1",
    "qmix.graph_stages:TokenizerStage._reconstruct:drop_kwarg:0": "valid weighs nodes: float ones weigh alike",
    "qmix.graph_stages:TokenizerStage._reconstruct:drop_kwarg:1": "on the CPU the default device is the nodes'",
    "qmix.graph_stages:TokenizerStage._reconstruct:drop_kwarg:2": "on the CPU the default device is the nodes'",
    "qmix.graph_stages:TokenizerStage.loss:compare:8": "cluster sizes are never negative: no code is below 0",
    "qmix.graph_stages:TokenizerStage.loss:drop_kwarg:10": "on the CPU the default device is z's",
    "qmix.pretrain:StageLearner.update:bool:11": "zeroed gradients and no gradients accumulate alike",
    "qmix.pretrain:StageLearner.update:bool:15": "the statistics' names and pieces have one length by construction",
    "qmix.pretrain:StageLearner.update:drop_kwarg:6": "Sums turns every count into float64",
    "ppo.loss:ppo_loss:compare:35": "a ratio exactly 1 +- clip_coef in floating point",
    "ppo.update:learn:compare:21": "a global KL exactly equal to target_kl",
    "ppo.update:learn:constant:15": "count >= 1 whenever a minibatch exists, which the config guarantees",
    "ppo.update:learn:drop_kwarg:10": "on the CPU the default device is the batch's (a GPU: an error)",
    "ppo.loop:train:binop:39": "total_steps sizes the progress bar only",
    "ppo.loop:train:binop:40": "counts for compile=auto only: eager and compiled steps compute the same numbers",
    "collectives:Runtime.check_in_sync:compare:2": "the bound is > 0, so spread 0 passes either way",
    "collectives:Runtime.check_in_sync:constant:8": "a float tolerance: drift a bug leaves is far above both",
    "collectives:parameter_checksum:drop_kwarg:2": "the checksum is compared between ranks only, all alike",
    "collectives:parameter_checksum:drop_kwarg:3": "on the CPU the default device is the parameters'",
    "seeding:derive_seed:binop:3": "(step % 2^32, step // 64) still tells every step apart",
    "seeding:Seeds.shared:constant:3": "any rank's hash serves, as long as every rank takes the same",
    "seeding:Seeds.eval_actions:binop:2": "minus the stride keeps the ranks' eval streams apart as plus does",
    "checkpoint:rng_state:boolop:1": "without CUDA both sides are false (a GPU test would see it)",
    "qmix.learner:QLearner.update:drop_call:6": "the gradient scaler is disabled unless precision=fp16",
    "supervised:accuracy:unary:6": "for the (N, C) logits accuracy takes, dim 1 is dim -1",
    "tdmpc2.learner:build_learner:boolop:6": "on a torch that compiles training steps both sides are false",
    "tdmpc2.learner:build_learner:drop_kwarg:13": "every param group sets its own lr",
    "checkpoint:set_rng_state:boolop:4": "without CUDA no state holds 'cuda' (a GPU test would see it)",
    "checkpoint:set_rng_state:drop_call:5": "without CUDA the line never runs (a GPU test would see it)",
    "collectives:Runtime._reduce:bool:16": "zip of a vector and its own keys: the lengths always match",
    "tdmpc2.loss:world_model_loss:unary:16": "the TD target's last dimension is 1 already",
    "tdmpc2.learner:build_learner:drop_call:12": "the broadcast carries the target buffers, made from the Qs at init",
    "qmix.learner:QLearner.update:constant:22": "a sampled batch holds a valid step, so the clamp never acts",
    "normalize:RunningMeanStd.moments:drop_kwarg:0": "torch.cat promotes the count to float64, exact below 2^24",
    "normalize:RunningMeanStd.moments:drop_kwarg:1": "on the CPU the default device is the batch's",
}

# Calls whose absence changes no result: logging and timing.
QUIET_CALLS = {"info", "debug", "warning", "log", "perf_counter", "phase", "move"}
SWAPPED_NAMES = {
    "mean": "sum",
    "sum": "mean",
    "min": "max",
    "max": "min",
    "amin": "amax",
    "amax": "amin",
    "all_reduce_mean": "all_reduce_sum",
    "all_reduce_sum": "all_reduce_mean",
    "clamp_min": "clamp_max",
    "clamp_max": "clamp_min",
}
BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult}
CMPOPS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclass(frozen=True)
class Mutant:
    target: str
    path: str
    function: str
    site: int  # index among the function's mutation sites (a walk of its AST)
    kind: str
    line: int  # in the original file
    before: str
    after: str

    @property
    def id(self) -> str:
        """Stable while the function's own code stays as it is (no line number: edits above move it)."""
        return f"{self.target}:{self.function}:{self.kind}:{self.site}"


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(f"no function {qualname}")


def _annotations(func: ast.AST) -> set[int]:
    """ids of nodes inside annotations and docstrings: not code to mutate."""
    skip: set[int] = set()
    for node in ast.walk(func):
        parts: list[ast.AST | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None:
                    parts.append(a.annotation)
            if not isinstance(node, ast.Lambda):
                parts.append(node.returns)
                parts += node.decorator_list
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    parts.append(body[0])
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _call_name(node.value) in QUIET_CALLS:
            parts.append(node)
        elif isinstance(node, ast.Raise):
            parts.append(node)
        elif isinstance(node, ast.withitem) and _call_name(node.context_expr) in QUIET_CALLS:
            parts.append(node.context_expr)
        for part in parts:
            if part is not None:
                skip.update(id(n) for n in ast.walk(part))
    return skip


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


def _sites(func: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, str, str | None, object]]:
    """(node, parent, kind, field, data) for every mutation of ``func``, in a fixed order."""
    skip = _annotations(func)
    parents: dict[int, tuple[ast.AST, str]] = {}
    for node in ast.walk(func):
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    parents[id(child)] = (node, field)
    for node in ast.walk(func):
        if id(node) in skip or node is func:
            continue
        parent = parents.get(id(node), (None, None))[0]
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOPS:
            yield node, parent, "binop", None, None
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in CMPOPS:
                    yield node, parent, "compare", None, i
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            yield node, parent, "unary", None, None
        elif isinstance(node, ast.BoolOp):
            yield node, parent, "boolop", None, None
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, parent, "bool", None, None
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            yield node, parent, "constant", None, None
        elif isinstance(node, ast.If):
            yield node, parent, "negate", None, None
        elif isinstance(node, ast.Call):
            for i, kw in enumerate(node.keywords):
                if kw.arg is not None and not isinstance(kw.value, ast.Constant):
                    yield node, parent, "drop_kwarg", None, i
            name = _call_name(node)
            if name in SWAPPED_NAMES:
                yield node, parent, "rename", None, None
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            field = parents[id(node)][1]
            yield node, parent, "drop_call", field, None


def _apply(node: ast.AST, parent: ast.AST | None, kind: str, field: str | None, data: object) -> None:
    if kind == "binop":
        node.op = BINOPS[type(node.op)]()
    elif kind == "compare":
        node.ops[data] = CMPOPS[type(node.ops[data])]()
    elif kind == "unary":  # `not x` -> `x`, `-x` -> `x`
        _replace(parent, node, node.operand)
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "bool":
        node.value = not node.value
    elif kind == "constant":
        v = node.value
        node.value = (1 if v == 0 else 0 if v == 1 else v + 1) if isinstance(v, int) else (1.0 if v == 0 else v * 2)
    elif kind == "negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif kind == "drop_kwarg":
        del node.keywords[data]
    elif kind == "rename":
        f = node.func
        if isinstance(f, ast.Attribute):
            f.attr = SWAPPED_NAMES[f.attr]
        else:
            f.id = SWAPPED_NAMES[f.id]
    elif kind == "drop_call":
        body = getattr(parent, field)
        body[body.index(node)] = ast.Pass()


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if isinstance(value, list):
            for i, child in enumerate(value):
                if child is old:
                    value[i] = new
                    return
        elif value is old:
            setattr(parent, field, new)
            return
    raise LookupError("node not found in its parent")


def _snippet(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # a bare operator or keyword has no source of its own
        text = type(node).__name__
    return " ".join(text.split())[:90]


def mutants(targets: tuple[Target, ...] = TARGETS) -> list[Mutant]:
    out = []
    for target in targets:
        tree = ast.parse((REPO / target.path).read_text())
        for qualname in target.functions:
            func = _function(tree, qualname)
            for site, (node, _, kind, _, _) in enumerate(_sites(func)):
                before = _snippet(node.test if kind == "negate" else node)
                mutated = copy.deepcopy(func)
                m_node, m_parent, m_kind, m_field, m_data = list(_sites(mutated))[site]
                _apply(m_node, m_parent, m_kind, m_field, m_data)
                if kind == "negate":
                    after = _snippet(m_node.test)
                elif kind == "unary":
                    after = _snippet(m_node.operand)
                elif kind == "drop_call":
                    after = "pass"
                else:
                    after = _snippet(m_node)
                out.append(
                    Mutant(target.name, target.path, qualname, site, kind, getattr(node, "lineno", 0), before, after)
                )
    return out


def mutated_source(m: Mutant) -> str:
    """The file of ``m`` with its function rewritten (the rest of the file byte-identical)."""
    source = (REPO / m.path).read_text()
    tree = ast.parse(source)
    func = _function(tree, m.function)
    node, parent, kind, field, data = list(_sites(func))[m.site]
    _apply(node, parent, kind, field, data)
    ast.fix_missing_locations(func)
    lines = source.splitlines(keepends=True)
    start = min([func.lineno, *(d.lineno for d in func.decorator_list)]) - 1
    indent = lines[func.lineno - 1][: len(lines[func.lineno - 1]) - len(lines[func.lineno - 1].lstrip())]
    body = "".join(indent + line + "\n" if line else "\n" for line in ast.unparse(func).splitlines())
    return "".join(lines[:start]) + body + "".join(lines[func.end_lineno :])


def workspace(root: Path) -> Path:
    """A copy of the package and the tests, which a mutant may change (``PYTHONPATH`` puts it first)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "ddprl", root / "ddprl", ignore=ignore)
    shutil.copytree(REPO / "tests", root / "tests", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def run_tests(root: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """(outcome, seconds, last lines): ``passed``, ``failed`` or ``timeout``."""
    env = dict(os.environ, PYTHONPATH=str(root), MUJOCO_GL=os.environ.get("MUJOCO_GL", "disable"))
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    start = time.monotonic()
    # its own session, so that a mutant that hangs is stopped with every rank its tests spawned
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", time.monotonic() - start, out[-300:]
    tail = "\n".join(out.strip().splitlines()[-3:])
    return ("passed" if proc.returncode == 0 else "failed"), time.monotonic() - start, tail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="print the mutants and exit")
    p.add_argument("--only", action="append", default=[], help="targets whose name contains this (repeatable)")
    p.add_argument("--mutant", action="append", default=[], help="run only the mutant of this id (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy")
    p.add_argument("--report", default="mutation-report.json")
    p.add_argument("--resume", action="store_true", help="skip mutants the report already has")
    p.add_argument("--survivors", action="store_true", help="run again only the report's survivors (after new tests)")
    p.add_argument("--sample", type=int, help="run this many mutants drawn at random (--seed) instead of all")
    p.add_argument("--seed", type=int, default=0, help="the draw of --sample")
    p.add_argument("--show", help="print the mutated function of this mutant id and exit")
    args = p.parse_args(argv)

    targets = tuple(t for t in TARGETS if not args.only or any(o in t.name for o in args.only))
    all_mutants = mutants(targets)
    if args.mutant:
        all_mutants = [m for m in all_mutants if m.id in args.mutant]
    if args.sample is not None and args.sample < len(all_mutants):
        # an unbiased estimate of the kill rate when running every mutant takes too long
        all_mutants = sorted(random.Random(args.seed).sample(all_mutants, args.sample), key=all_mutants.index)
    if args.list:
        for m in all_mutants:
            print(f"{m.id}\t{m.before}  ->  {m.after}" + ("\t(equivalent)" if m.id in EQUIVALENT else ""))
        print(f"{len(all_mutants)} mutants in {len(targets)} targets")
        return 0
    if args.show:
        shown = next((m for m in all_mutants if m.id == args.show), None)
        if shown is None:
            print(f"mutation.py: no mutant {args.show!r} (--list names them)", file=sys.stderr)
            return 2
        print(mutated_source(shown))
        return 0

    report_path = Path(args.report)
    kept = args.resume or args.survivors
    results: dict[str, dict] = json.loads(report_path.read_text()) if kept and report_path.exists() else {}
    if args.survivors:
        survived = {k for k, v in results.items() if v["status"] == "survived"}
        all_mutants = [m for m in all_mutants if m.id in survived]
        for m in all_mutants:
            del results[m.id]
        targets = tuple(t for t in targets if any(m.target == t.name for m in all_mutants))
    tmp = Path(tempfile.mkdtemp(prefix="ddprl-mutants-"))
    roots = [workspace(tmp / f"w{i}") for i in range(args.jobs)]

    # the clean tests of each target pass, and how long they take: a mutant's time limit
    limits: dict[str, float] = {}
    for t in targets:
        outcome, seconds, tail = run_tests(roots[0], t.tests, timeout=1800)
        if outcome != "passed":
            print(f"{t.name}: its tests fail without a mutant:\n{tail}", file=sys.stderr)
            return 1
        limits[t.name] = max(60.0, 3 * seconds)
        print(f"{t.name}: tests pass in {seconds:.0f} s", flush=True)

    for m in all_mutants:  # shown equivalent: not run, kept in the report with the reason
        if m.id in EQUIVALENT:
            results[m.id] = {"status": "equivalent", "why": EQUIVALENT[m.id], "before": m.before, "after": m.after}
    todo = [m for m in all_mutants if m.id not in results]
    free = list(roots)

    def one(m: Mutant) -> tuple[Mutant, dict]:
        root = free.pop()
        try:
            path = root / m.path
            original = path.read_text()
            path.write_text(mutated_source(m))
            try:
                outcome, seconds, tail = run_tests(
                    root, next(t for t in TARGETS if t.name == m.target).tests, limits[m.target]
                )
            finally:
                path.write_text(original)
        finally:
            free.append(root)
        status = "survived" if outcome == "passed" else "killed"
        return m, {
            "status": status,
            "outcome": outcome,
            "seconds": round(seconds, 1),
            "tail": tail,
            "kind": m.kind,
            "line": m.line,
            "before": m.before,
            "after": m.after,
        }

    with ThreadPoolExecutor(args.jobs) as pool:
        for i, (m, result) in enumerate(pool.map(one, todo), 1):
            results[m.id] = result
            report_path.write_text(json.dumps(results, indent=1, sort_keys=True))
            mark = "killed  " if result["status"] == "killed" else "SURVIVED"
            print(f"[{i}/{len(todo)}] {mark} {m.id}  {m.before}  ->  {m.after}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    summary(mutants(), results)  # every mutant the report holds, this run's and earlier ones
    return 0


def summary(all_mutants: list[Mutant], results: dict[str, dict]) -> None:
    """Kill rate per target and overall, of the mutants ``results`` holds (equivalent ones apart)."""
    by_target: dict[str, list[int]] = {}
    equivalent = 0
    for m in all_mutants:
        status = results.get(m.id, {}).get("status")
        if status == "equivalent":
            equivalent += 1
        elif status is not None:
            counts = by_target.setdefault(m.target, [0, 0])
            counts[0] += status == "killed"
            counts[1] += 1
    for name, (killed, total) in by_target.items():
        print(f"{name:16s} {killed:4d} / {total:4d} killed  {100 * killed / max(total, 1):5.1f} %")
    killed = sum(k for k, _ in by_target.values())
    total = sum(t for _, t in by_target.values())
    print(
        f"{'all':16s} {killed:4d} / {total:4d} killed  {100 * killed / max(total, 1):5.1f} %  "
        f"({equivalent} equivalent mutants left out)"
    )


if __name__ == "__main__":
    sys.exit(main())
