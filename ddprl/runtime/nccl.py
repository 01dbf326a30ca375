"""NCCL environment presets per interconnect (``nccl_preset=none|nvlink|ib``)."""

from __future__ import annotations

import os

from ddprl.errors import UsageError

# NCCL settings per interconnect (nccl_preset=...). Applied only where the user's environment
# has no value: an exported variable always wins.
NCCL_PRESETS: dict[str, dict[str, str]] = {
    "none": {},
    # one node, GPUs joined by NVLink/NVSwitch: peer-to-peer over NVLink, NVLink SHARP where the
    # switch has it, no InfiniBand (nothing leaves the node).
    "nvlink": {
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_NVLS_ENABLE": "1",
        "NCCL_IB_DISABLE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN",
    },
    # several nodes over InfiniBand: IB on, GPUDirect RDMA through the host bridge, bootstrap
    # sockets off loopback and docker bridges.
    "ib": {
        "NCCL_IB_DISABLE": "0",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_SOCKET_IFNAME": "^lo,docker",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN",
    },
}


def apply_nccl_preset(preset: str, environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """Set the preset's NCCL variables that ``environ`` lacks; return what was set."""
    if preset not in NCCL_PRESETS:
        raise UsageError(f"nccl_preset={preset!r} is not one of {', '.join(NCCL_PRESETS)}")
    chosen = {k: v for k, v in NCCL_PRESETS[preset].items() if k not in environ}
    environ.update(chosen)
    return chosen
