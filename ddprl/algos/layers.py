"""Layers shared by the algorithms' networks."""

from __future__ import annotations

import torch
from torch import nn


class OutputLinear(nn.Linear):
    """A network's last layer, computed in fp32 even under bf16 autocast.

    bf16 keeps 8 significant bits: a PPO value of 100 would come out in steps of 0.5, and
    TD-MPC2's two-hot logits would move its decoded rewards and Qs by percents; that rounding
    would enter every target and loss. The hidden layers keep bf16. (Same parameters and
    state-dict keys as ``nn.Linear``.)
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(x.device.type):  # nothing to switch off: entering autocast costs ~7 us a call
            return super().forward(x.float())
        with torch.autocast(device_type=x.device.type, enabled=False):
            return super().forward(x.float())
