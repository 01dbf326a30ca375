"""Observations of a Gymnasium space as one flat float32 vector per env.

Each part as Stable-Baselines3's ``preprocess_obs`` encodes it (without its image scaling), and
value for value ``gymnasium.spaces.flatten``: Discrete as a one-hot, MultiDiscrete as its
variables' one-hots concatenated, MultiBinary and Box as their values, Tuple and Dict as their
parts so encoded and concatenated (a Dict in its space's key order: sorted, unless built from an
OrderedDict).

>>> space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiBinary(2)))
>>> FlatEncoder(space)((np.array([2, 0]), np.array([[1, 0], [0, 1]], np.int8)), n=2)
array([[0., 0., 1., 1., 0.],
       [1., 0., 0., 0., 1.]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

# What FlatEncoder takes, as error messages name it.
ENCODABLE = "Box, Discrete, MultiDiscrete or MultiBinary spaces, or a Tuple or Dict of these"

_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def unencodable(space: gym.Space) -> gym.Space | None:
    """The first part of ``space`` (``space`` itself included) that :class:`FlatEncoder` cannot
    encode, such as a Text, Graph or Sequence; None when it can encode all of it.

    >>> unencodable(gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Text(4)}))
    Text(1, 4, charset=0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz)
    """
    if isinstance(space, _LEAVES):
        return None
    if isinstance(space, (gym.spaces.Tuple, gym.spaces.Dict)):
        parts = list(space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces)
        if not parts:  # nothing to observe
            return space
        return next((bad for bad in map(unencodable, parts) if bad is not None), None)
    return space


class _Part(NamedTuple):
    """One leaf space's columns of the encoded vector."""

    path: tuple[int | str, ...]  # indices/keys from the batched observation to this leaf's batch
    start: int  # its first column
    width: int  # its columns
    # one-hot leaves: per variable, the column of value 0 (value v lands in column zero + v); None: values as they are
    zero: np.ndarray | None
    box: bool  # a Box's values: the columns observation normalisation may rescale


class FlatEncoder:
    """Encodes batches of observations of ``space`` (as a Gymnasium vector env batches them)
    into (N, ``size``) float32 arrays.

    ``observation_space`` is the encoded Box (one-hot and MultiBinary columns in [0, 1], Box
    columns within their bounds); ``normalized`` (``size``,) bool marks the Box columns, the only
    ones SB3's ``VecNormalize`` normalises.
    """

    def __init__(self, space: gym.Space):
        bad = unencodable(space)
        if bad is not None:
            raise ValueError(f"cannot encode {bad}; encodable: {ENCODABLE}")
        self.space = space
        self._parts: list[_Part] = []
        self._row_starts: dict[int, np.ndarray] = {}  # by batch size: each row's first index in the flat output
        lows: list[np.ndarray] = []
        highs: list[np.ndarray] = []
        self.size = 0
        for path, leaf in _leaves(space, ()):
            zero: np.ndarray | None = None
            if isinstance(leaf, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
                nvec = np.asarray(leaf.n if isinstance(leaf, gym.spaces.Discrete) else leaf.nvec, np.int64).reshape(-1)
                first = np.concatenate([[0], np.cumsum(nvec)[:-1]])  # each variable's first column
                zero = self.size + first - np.asarray(leaf.start, np.int64).reshape(-1)
                width = int(nvec.sum())
                low, high = np.zeros(width), np.ones(width)
            elif isinstance(leaf, gym.spaces.MultiBinary):
                width = int(np.prod(leaf.shape))
                low, high = np.zeros(width), np.ones(width)
            else:
                low, high = leaf.low.reshape(-1), leaf.high.reshape(-1)
                width = low.size
            self._parts.append(_Part(path, self.size, width, zero, isinstance(leaf, gym.spaces.Box)))
            lows.append(low)
            highs.append(high)
            self.size += width
        self.normalized = np.concatenate([np.full(part.width, part.box) for part in self._parts])
        self.observation_space = gym.spaces.Box(
            np.concatenate(lows).astype(np.float32), np.concatenate(highs).astype(np.float32), dtype=np.float32
        )

    def __call__(self, batch: Any, n: int) -> np.ndarray:
        """(n, size) float32 encoding of ``batch``, ``n`` observations batched as
        ``gymnasium.vector.utils.concatenate`` batches them (a vector env's ``obs``)."""
        # A new array each call: the tensor made from it shares its memory and outlives the call.
        out = np.zeros((n, self.size), dtype=np.float32)
        flat = out.reshape(-1)
        rows = self._row_starts.get(n)
        if rows is None:
            rows = self._row_starts[n] = np.arange(0, n * self.size, self.size).reshape(n, 1)
        for part in self._parts:
            x = batch
            for key in part.path:
                x = x[key]
            if part.zero is None:
                out[:, part.start : part.start + part.width] = x.reshape(n, part.width)
            else:
                flat[x.reshape(n, -1) + (part.zero + rows)] = 1.0
        return out

    def each(self, observations: Sequence[Any]) -> np.ndarray:
        """(len(observations), size) float32 encoding of single observations (a vector env's
        ``info["final_obs"]`` entries)."""
        n = len(observations)
        return self(concatenate(self.space, observations, create_empty_array(self.space, n)), n)


def _leaves(space: gym.Space, path: tuple[int | str, ...]) -> list[tuple[tuple[int | str, ...], gym.Space]]:
    """The leaf spaces of ``space`` in encoding order, each with its path."""
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, part in enumerate(space.spaces) for leaf in _leaves(part, (*path, i))]
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, part in space.spaces.items() for leaf in _leaves(part, (*path, key))]
    return [(path, space)]
