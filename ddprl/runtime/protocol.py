"""What a process of a job offers whatever its engine (:class:`JobRuntime`), and what the runtime
reads of a job's config (:class:`LaunchConfig`).

The torch engine's :class:`~ddprl.runtime.collectives.Runtime` and the JAX engine's
:class:`~ddprl.jax.runtime.JaxRuntime` both satisfy it. Code that serves either engine (``Run``,
checkpoints, evaluation, the stop check) asks for a ``JobRuntime``; an algorithm's loop asks for
its engine's runtime, whose other verbs (``wrap``, ``no_sync``, the device mesh, ...) it uses.
Nothing here is imported at run time: the names below are for annotations only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from ddprl.runtime.seeding import Seeds


class JobRuntime(Protocol):
    """This process's place in the job and the host-side collectives every engine has.

    The collectives are called by every rank, in the same order (docs/distributed.md, invariant 1).
    """

    rank: int  # global rank (the JAX engine: process index)
    world_size: int  # processes in the job
    is_main: bool  # rank 0: the one that writes
    first_on_host: bool  # the lowest rank on its machine: says what every host should hear
    hosts: list[str]  # host name of every rank, by rank
    device: torch.device  # where host-side torch tensors live (checkpoints, evaluation)

    def seeds(self, seed: int) -> Seeds:
        """This rank's seeds for every purpose (``ddprl.runtime.seeding``)."""
        ...

    def all_gather_object(self, obj: Any, /) -> list[Any]:
        """Collective: every rank's ``obj`` (picklable), by rank."""
        ...

    def all_reduce_mean(self, values: dict[str, float], /) -> dict[str, float]:
        """Collective: the mean over ranks of a dict of numbers (the same keys on every rank)."""
        ...

    def broadcast_object(self, obj: Any, src: int = 0, /) -> Any:
        """Collective: rank ``src``'s ``obj`` on every rank."""
        ...

    def barrier(self) -> None:
        """Collective: returns when every rank has called it."""
        ...


class LaunchConfig(Protocol):
    """The keys of a job's config that launching and placement read. Every config class has them
    (``ddprl.config.schema.JobConfig``); the runtime, which the config package builds on, names
    them here rather than importing the config classes."""

    world_size: Any  # a number, or "auto" until resolved
    nnodes: int
    node_rank: int
    device: str
    backend: str
    master_addr: str
    master_port: str
    dist_timeout: float
    sources: dict[str, str]  # which layer gave each value

    def resolved(self, world_size: int) -> Any:
        """This config with ``world_size`` (and the sizes derived from it) made concrete."""
        ...
