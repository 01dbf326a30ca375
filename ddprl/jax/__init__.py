"""The JAX engine (``engine=jax``): environments and training compiled whole, sharded over devices.

Nothing here is imported by the core package: ``import ddprl`` never needs JAX.

- ``runtime``: processes (``jax.distributed``), the device mesh, host-side collectives, launch,
  ``doctor``.
- ``envs``: gymnax and brax/MJX tasks as pure functions of one env (auto-reset inside the step).
- ``state``: pytrees to flat dicts of torch tensors and back (checkpoints in ddprl's own format,
  loadable on any number of devices), per-process shards of sharded arrays.
- ``vec``: a torch ``VecEnv`` over a JAX env, for ``ddprl eval`` and ``ddprl play``.

The algorithms live beside their torch versions (``ddprl/algos/ppo_jax``).
"""
