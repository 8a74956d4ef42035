"""Faster CPU kernels for the convolutions of a network (trunk and body alike).

**Cropped depthwise convs (exact).** At small input sizes (32 px) EfficientNet's last stages see 1x1
or 2x2 maps through 5x5 depthwise kernels with padding 2: every tap outside the centre multiplies
padding zeros, yet PyTorch's CPU kernel takes ~400x longer than the useful arithmetic. Cropping the
kernel to the taps that can touch real input (and the padding to match) computes the same sums, and the
same gradients for the taps that matter (the cropped-away taps get zero gradient in both cases).

**Pointwise convs as one matrix product (the last bits differ).** On the CPU a 1x1 stride-1 conv goes
through oneDNN's convolution, which on small maps (EfficientNet-Lite0's body sees 2x2 and 1x1 at 32 px)
spends most of its time outside the arithmetic: forward and backward of tiny_cil's body ran at 15 % of
a GEMM's rate. The same sums as one ``F.linear`` over every pixel (rows = batch x height x width) ran
the body's training twice and its evaluation over cached trunk features 1.7 times as fast. The sums are
added in another order, so outputs move by ~5e-7 and training carries that into every later number: the
kernel set is part of a CPU run's identity (``harness.results.comparability.kernel_label``), and runs or caches
made with other kernels are never mixed with runs made now. Other devices keep the stock convolution.

**Depthwise convs on the smallest maps (the last bits of gradients differ).** On the CPU, oneDNN's
depthwise convolution backward on 2x2 and 1x1 maps cost a quarter of a training step of tiny_cil's body,
most of it in one layer (block 5's stride-2 5x5 'same' conv, 2x2 in, 1x1 out: 9.7 ms a step). Two
rewrites, CPU only: a ``Conv2dSame`` computes with its kernel cropped to the taps that can touch real
input (for that layer 2x2 of 25, no padding); a stride-1 depthwise conv whose map has at most 4 pixels
computes as one broadcast product over a pixels-by-pixels tap table and a sum, in the pixels-major
layout the 1x1 matrix products hand it. Forward sums move by ~3e-7 at most, weight gradients in the
last bits: part of the CPU kernel set as well.

**FLOPs count the stock convolutions** (the rule is stated once, in ``harness.model.flops``):
``stock_kernels()`` below is what the count traces under, so no kernel change moves a FLOP budget.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from timm.layers import Conv2dSame
from timm.layers.padding import get_same_padding
from torch import Tensor, nn

SMALL_MAP_PIXELS = 4  # the tap-table path pays off on 2x2 and 1x1 maps; oneDNN's conv on larger ones

_STOCK = [False]


@contextmanager
def stock_kernels() -> Iterator[None]:
    """Compute with the stock convolutions inside (what the FLOP count traces)."""
    was, _STOCK[0] = _STOCK[0], True
    try:
        yield
    finally:
        _STOCK[0] = was


def _fast(x: Tensor) -> bool:
    return x.device.type == "cpu" and not _STOCK[0]


@functools.lru_cache(maxsize=64)
def _tap_table(h: int, w: int, kh: int, kw: int, ph: int, pw: int) -> tuple[Tensor, Tensor]:
    """Row and column of the kernel tap that joins input pixel p to output pixel o of a stride-1 conv with
    padding (ph, pw), pixels in row-major order; (kh, kw) where no tap does (an appended zero)."""
    pixels = [(i, j) for i in range(h) for j in range(w)]
    rows = torch.tensor([[ph + p[0] - o[0] for o in pixels] for p in pixels])
    cols = torch.tensor([[pw + p[1] - o[1] for o in pixels] for p in pixels])
    inside = (rows >= 0) & (rows < kh) & (cols >= 0) & (cols < kw)
    return torch.where(inside, rows, kh), torch.where(inside, cols, kw)


def small_map_depthwise(x: Tensor, weight: Tensor, bias: Tensor | None, padding: tuple[int, int]) -> Tensor:
    """A stride-1 depthwise conv (one filter per channel) as out[o] = sum over p of x[p] * tap[p, o]."""
    n, c, h, w = x.shape
    if h * w == 1:  # one tap: the kernel's centre
        centre = weight[:, :, padding[0], padding[1]].view(1, c, 1, 1)
        return x * centre if bias is None else torch.addcmul(bias.view(1, c, 1, 1), x, centre)
    rows, cols = _tap_table(h, w, weight.shape[-2], weight.shape[-1], *padding)
    taps = F.pad(weight[:, 0], (0, 1, 0, 1)).permute(1, 2, 0)[rows, cols]  # [p, o, channel]
    pixels = x.permute(0, 2, 3, 1).reshape(n, h * w, 1, c)
    out = (pixels * taps).sum(1)
    if bias is not None:
        out = out + bias
    return out.view(n, h, w, c).permute(0, 3, 1, 2)  # NCHW shape, pixels-major memory


class CroppingDepthwiseConv2d(nn.Conv2d):
    """A stride-1 'same' depthwise conv that crops its kernel when the input is smaller than it."""

    padding: tuple[int, int]  # built with integer padding (never "same" as a string)

    def forward(self, x: Tensor) -> Tensor:
        ph, pw = self.padding
        h, w = x.shape[-2:]
        if _fast(x) and h * w <= SMALL_MAP_PIXELS and self.out_channels == self.groups:
            return small_map_depthwise(x, self.weight, self.bias, (ph, pw))
        if h > ph and w > pw:
            return super().forward(x)
        ch, cw = min(ph, h - 1), min(pw, w - 1)  # taps on each side that can reach real input
        weight = self.weight[:, :, ph - ch : ph + ch + 1, pw - cw : pw + cw + 1]
        return F.conv2d(x, weight, self.bias, 1, (ch, cw), 1, self.groups)


@functools.lru_cache(maxsize=256)
def _useful_taps(size: int, k: int, stride: int) -> tuple[int, int, int, int]:
    """Of a 'same' conv's k taps along one axis of ``size`` pixels: the first and one past the last that
    touch real input, and the padding before and after the input that the cropped kernel needs."""
    pad = get_same_padding(size, k, stride, 1)
    before, out = pad // 2, -(-size // stride)
    useful = [t for t in range(k) if any(0 <= o * stride + t - before < size for o in range(out))]
    first, end = useful[0], useful[-1] + 1
    lead = before - first
    return first, end, lead, max(0, (out - 1) * stride + end - first - size - lead)


class CroppingConv2dSame(Conv2dSame):
    """timm's TF-'same' conv that, on the CPU, crops its kernel to the taps that can touch real input."""

    def forward(self, x: Tensor) -> Tensor:
        if not _fast(x):
            return super().forward(x)
        (r0, r1, top, bottom), (c0, c1, left, right) = (
            _useful_taps(n, k, s) for n, k, s in zip(x.shape[-2:], self.kernel_size, self.stride))
        if (r1 - r0, c1 - c0) == tuple(self.kernel_size):
            return super().forward(x)
        if top or bottom or left or right:
            x = F.pad(x, (left, right, top, bottom))
        return F.conv2d(x, self.weight[:, :, r0:r1, c0:c1], self.bias, self.stride, 0, 1, self.groups)


class PointwiseConvAsGemm(nn.Conv2d):
    """A 1x1 stride-1 conv that computes, on the CPU, as one matrix product over all pixels."""

    def forward(self, x: Tensor) -> Tensor:
        if not _fast(x) or x.ndim != 4:
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


def _same(m: nn.Module) -> bool:
    return type(m) is Conv2dSame and m.dilation == (1, 1)


def crop_same_convs(module: nn.Module) -> int:
    """Swap timm's ``Conv2dSame`` for ``CroppingConv2dSame``; returns how many were swapped."""
    return _swap(module, _same, CroppingConv2dSame)
