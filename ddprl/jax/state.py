"""Pytrees in and out of ddprl checkpoints, and the per-process part of sharded arrays.

Checkpoints of the JAX engine are ddprl checkpoints (``step_<N>.pt``, read with
``weights_only=True``): every pytree is stored as a flat ``{"path": tensor}`` dict, the path
being JAX's key string of the leaf (``['actor'][0]['w']``). No pickled Python objects, no
device layout: a checkpoint written on 4 devices loads on 1 (the shared state is replicated;
only the per-process env state depends on the device count, and is kept apart).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ddprl.errors import UsageError


def to_flat(tree: Any) -> dict[str, torch.Tensor]:
    """``tree``'s leaves as CPU tensors keyed by their path (uint32, e.g. PRNG keys, as int64)."""
    import jax

    flat: dict[str, torch.Tensor] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        array = np.asarray(jax.device_get(leaf))
        if array.dtype == np.uint32:
            array = array.astype(np.int64)
        flat[jax.tree_util.keystr(path)] = torch.from_numpy(np.array(array, copy=True))
    return flat


def from_flat(flat: dict[str, torch.Tensor], template: Any, what: str) -> Any:
    """The pytree shaped like ``template`` with the leaves of ``flat`` (numpy, template dtypes)."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path)
        if name not in flat:
            raise UsageError(f"checkpoint has no {what}{name}: it was written by another model or ddprl version")
        value = flat[name].numpy()
        if tuple(value.shape) != tuple(np.shape(leaf)):
            raise UsageError(
                f"checkpoint {what}{name} has shape {tuple(value.shape)}, the model needs {tuple(np.shape(leaf))}"
            )
        out.append(value.astype(np.asarray(leaf).dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def process_local(tree: Any) -> Any:
    """This process's rows of arrays sharded along their first axis (its devices, in mesh order)."""
    import jax

    def local(x: Any) -> np.ndarray:
        shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        return np.concatenate([np.asarray(s.data) for s in shards])

    return jax.tree.map(local, tree)


def from_process_local(tree: Any, sharding: Any) -> Any:
    """Global arrays sharded by ``sharding`` from each process's rows (:func:`process_local`)."""
    import jax

    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree)
