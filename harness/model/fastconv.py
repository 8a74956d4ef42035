"""Exact speed-up for 'same' depthwise convolutions on feature maps smaller than their kernel.

At small input sizes (32 px) EfficientNet's last stages see 1x1 or 2x2 maps through 5x5 depthwise
kernels with padding 2: every tap outside the centre multiplies padding zeros, yet PyTorch's CPU
kernel takes ~400x longer than the useful arithmetic. Cropping the kernel to the taps that can touch
real input (and the padding to match) computes the same sums, and the same gradients for the taps
that matter (the cropped-away taps get zero gradient in both cases).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class CroppingDepthwiseConv2d(nn.Conv2d):
    """A stride-1 'same' depthwise conv that crops its kernel when the input is smaller than it."""

    def forward(self, x: Tensor) -> Tensor:
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        h, w = x.shape[-2:]
        if h > ph and w > pw:
            return super().forward(x)
        ch, cw = min(ph, h - 1), min(pw, w - 1)  # taps on each side that can reach real input
        weight = self.weight[:, :, ph - ch : ph + ch + 1, pw - cw : pw + cw + 1]
        return F.conv2d(x, weight, self.bias, 1, (ch, cw), 1, self.groups)


def _croppable(m: nn.Module) -> bool:
    if type(m) is not nn.Conv2d or m.groups != m.in_channels or m.groups == 1:
        return False
    if m.stride != (1, 1) or m.dilation != (1, 1) or not isinstance(m.padding, tuple):
        return False
    (kh, kw), (ph, pw) = m.kernel_size, m.padding
    return kh == 2 * ph + 1 and kw == 2 * pw + 1 and m.padding_mode == "zeros"


def crop_depthwise_convs(module: nn.Module) -> int:
    """Swap eligible convs in place (same parameters and state dict); returns how many were swapped."""
    swapped = 0
    for m in module.modules():
        if _croppable(m):
            m.__class__ = CroppingDepthwiseConv2d
            swapped += 1
    return swapped
