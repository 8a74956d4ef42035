"""Faster CPU kernels for the convolutions of a network's body.

**Cropped depthwise convs (exact).** At small input sizes (32 px) EfficientNet's last stages see 1x1
or 2x2 maps through 5x5 depthwise kernels with padding 2: every tap outside the centre multiplies
padding zeros, yet PyTorch's CPU kernel takes ~400x longer than the useful arithmetic. Cropping the kernel to the taps that can touch
real input (and the padding to match) computes the same sums, and the same gradients for the taps
that matter (the cropped-away taps get zero gradient in both cases).

**Pointwise convs as one matrix product (the last bits differ).** On the CPU a 1x1 stride-1 conv goes
through oneDNN's convolution, which on small maps (EfficientNet-Lite0's body sees 2x2 and 1x1 at 32 px)
spends most of its time outside the arithmetic: forward and backward of tiny_cil's body ran at 15 % of
a GEMM's rate. The same sums as one ``F.linear`` over every pixel (rows = batch x height x width) run
the body's training twice and its evaluation over cached trunk features 1.7 times as fast. The sums are added in another order, so
outputs move by ~5e-7 and training carries that into every later number: the kernel set is part of a
CPU run's identity (``harness.results.threads.CPU_KERNELS``), and runs or caches made with the old
kernels are never mixed with runs made now. Other devices keep the stock convolution.
"""

from __future__ import annotations

from collections.abc import Callable

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


class PointwiseConvAsGemm(nn.Conv2d):
    """A 1x1 stride-1 conv that computes, on the CPU, as one matrix product over all pixels."""

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.ndim != 4:
            return super().forward(x)
        n, c, h, w = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(n * h * w, c)
        out = F.linear(rows, self.weight.view(self.out_channels, c), self.bias)
        return out.view(n, h, w, self.out_channels).permute(0, 3, 1, 2)  # NCHW shape, pixels-major memory


def _pointwise(m: nn.Module) -> bool:
    return (type(m) is nn.Conv2d and m.kernel_size == (1, 1) and m.stride == (1, 1) and m.groups == 1
            and m.dilation == (1, 1) and m.padding in ((0, 0), "valid", "same"))


def _swap(module: nn.Module, eligible: Callable[[nn.Module], bool], to: type[nn.Conv2d]) -> int:
    """Give every eligible conv under ``module`` the class ``to`` in place (same parameters and state
    dict); returns how many were swapped."""
    found = [m for m in module.modules() if eligible(m)]
    for m in found:
        m.__class__ = to
    return len(found)


def gemm_pointwise_convs(module: nn.Module) -> int:
    """Swap 1x1 stride-1 convs for ``PointwiseConvAsGemm``; returns how many were swapped."""
    return _swap(module, _pointwise, PointwiseConvAsGemm)


def _croppable(m: nn.Module) -> bool:
    if type(m) is not nn.Conv2d or m.groups != m.in_channels or m.groups == 1:
        return False
    if m.stride != (1, 1) or m.dilation != (1, 1) or not isinstance(m.padding, tuple):
        return False
    (kh, kw), (ph, pw) = m.kernel_size, m.padding
    return kh == 2 * ph + 1 and kw == 2 * pw + 1 and m.padding_mode == "zeros"


def crop_depthwise_convs(module: nn.Module) -> int:
    """Swap eligible depthwise convs for ``CroppingDepthwiseConv2d``; returns how many were swapped."""
    return _swap(module, _croppable, CroppingDepthwiseConv2d)
