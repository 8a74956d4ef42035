from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from bench_stability_gap.harness.model.backbone import GrowingHead, create_network, split_network
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.model.fastconv import (CroppingConv2dSame, CroppingDepthwiseConv2d,
                                                       PointwiseConvAsGemm, crop_depthwise_convs, crop_same_convs,
                                                       gemm_pointwise_convs, stock_kernels)
from timm.layers import Conv2dSame
from bench_stability_gap.harness.spec.protocol import load_protocol


def test_packaged_imagenet_weights_load_into_timm_and_split_is_exact():
    spec = load_protocol("tiny_cil").backbone
    net = create_network(spec).eval()
    reference = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    assert not torch.equal(net.conv_stem.weight, reference.conv_stem.weight)  # weights really loaded
    split = split_network(copy.deepcopy(net), spec, num_classes=None).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(split(x), net(x), rtol=1e-4, atol=1e-5)
    assert all(not p.requires_grad for p in split.trunk.parameters())


@pytest.mark.parametrize(("protocol", "size"), [("cil_places_lt", 64), ("cil_convnextv1_places_lt", 64),
                                              ("cil_mobilevit_places_lt", 64)])
def test_split_paths_reproduce_the_full_model(protocol, size):
    spec = load_protocol(protocol).backbone.model_copy(update={"weights": "none:"})
    net = create_network(spec).eval()
    split = split_network(copy.deepcopy(net), spec, num_classes=None).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(split(x), net(x), rtol=1e-4, atol=1e-5)


def test_head_grows_keeping_old_rows():
    head = GrowingHead(8, 3)
    before = head.fc.weight.detach().clone()
    head.grow(2, torch.Generator().manual_seed(0))
    assert head.num_classes == 5
    assert torch.equal(head.fc.weight[:3], before)
    assert torch.equal(head.fc.bias[3:], torch.zeros(2))


def test_trunk_stays_in_eval_mode():
    spec = load_protocol("tiny_cil").backbone
    model = split_network(create_network(spec), spec, 10)
    model.train()
    assert not any(m.training for m in model.trunk.modules())
    assert model.body.training


def test_bad_module_path_is_named():
    spec = load_protocol("tiny_cil").backbone.model_copy(update={"trunk": ["conv_stem", "blocks.9"]})
    with pytest.raises(BenchError, match="blocks.9"):
        split_network(create_network(spec), spec, 10)


@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_cropped_depthwise_conv_is_exact(size):
    conv = nn.Conv2d(6, 6, 5, padding=2, groups=6)
    fast = copy.deepcopy(conv)
    assert crop_depthwise_convs(fast) == 1 and isinstance(fast, CroppingDepthwiseConv2d)
    x = torch.randn(3, 6, size, size, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = conv(x), fast(x2)
    torch.testing.assert_close(y2, y, rtol=1e-6, atol=1e-6)
    y.square().sum().backward()
    y2.square().sum().backward()
    torch.testing.assert_close(fast.weight.grad, conv.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-6)
    assert fast.state_dict().keys() == conv.state_dict().keys()


def _same_sums(conv: nn.Module, fast: nn.Module, x: torch.Tensor, out_tol: float = 1e-6) -> None:
    """``fast`` computes what ``conv`` does, and back-propagates the same gradients, to float rounding."""
    x2 = x.detach().clone().requires_grad_(True)
    x = x.detach().clone().requires_grad_(True)
    y, y2 = conv(x), fast(x2)
    assert y2.shape == y.shape
    torch.testing.assert_close(y2, y, rtol=1e-5, atol=out_tol)
    upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))  # the same gradient from above
    (y * upstream).sum().backward()
    (y2 * upstream).sum().backward()
    for a, b in ((fast.weight.grad, conv.weight.grad), (x2.grad, x.grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if conv.bias is not None:
        torch.testing.assert_close(fast.bias.grad, conv.bias.grad, rtol=1e-5, atol=1e-5)
    assert fast.state_dict().keys() == conv.state_dict().keys()


@pytest.mark.parametrize("size,kernel,channels_last,bias", [
    (1, 5, False, False), (1, 3, True, True), (2, 5, True, False), (2, 3, True, True), (2, 3, False, False),
])
def test_a_depthwise_conv_on_the_smallest_maps_as_a_tap_table_computes_the_same_sums(size, kernel, channels_last,
                                                                                       bias):
    torch.manual_seed(size * kernel)
    conv = nn.Conv2d(6, 6, kernel, padding=kernel // 2, groups=6, bias=bias)
    fast = copy.deepcopy(conv)
    assert crop_depthwise_convs(fast) == 1
    x = torch.randn(4, 6, size, size)
    if channels_last:  # as the 1x1 matrix products hand it over
        x = x.contiguous(memory_format=torch.channels_last)
    _same_sums(conv, fast, x)
    with stock_kernels():  # the FLOP count's trace takes the cropped convolution, as before
        assert fast.eval()(x).shape == conv(x).shape


@pytest.mark.parametrize("size,kernel,stride", [(1, 5, 2), (2, 5, 2), (2, 3, 2), (3, 5, 1), (5, 3, 2), (8, 5, 2)])
def test_a_same_conv_cropped_to_the_taps_that_touch_input_computes_the_same_sums(size, kernel, stride):
    torch.manual_seed(size + kernel)
    conv = Conv2dSame(6, 6, kernel, stride=stride, groups=6, bias=False)
    fast = copy.deepcopy(conv)
    assert crop_same_convs(fast) == 1 and isinstance(fast, CroppingConv2dSame)
    _same_sums(conv, fast, torch.randn(3, 6, size, size), out_tol=0.0 if size <= 2 else 1e-6)


@pytest.mark.parametrize("size", [1, 2, 5])
def test_a_pointwise_conv_as_one_matrix_product_computes_the_same_sums(size):
    torch.manual_seed(size)
    conv = nn.Conv2d(12, 7, 1)
    fast = copy.deepcopy(conv)
    assert gemm_pointwise_convs(fast) == 1 and isinstance(fast, PointwiseConvAsGemm)
    x = torch.randn(4, 12, size, size, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = conv(x), fast(x2)
    assert y2.shape == y.shape
    torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-6)  # the same sums, added in another order
    upstream = torch.randn_like(y)  # a gradient arriving from above, the same for both
    (y * upstream).sum().backward()
    (y2 * upstream).sum().backward()
    torch.testing.assert_close(fast.weight.grad, conv.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.bias.grad, conv.bias.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)
    assert fast.state_dict().keys() == conv.state_dict().keys()


def test_trunk_and_body_convs_take_the_cpu_kernels_and_flops_count_the_stock_network():
    from bench_stability_gap.harness.model.flops import split_macs

    spec = load_protocol("tiny_cil").backbone
    model = split_network(create_network(spec), spec, 10)
    swapped = [m for m in model.body.modules() if isinstance(m, PointwiseConvAsGemm)]
    assert len(swapped) == 17  # blocks 4-6 (3, 4 and 1 blocks): an expansion and a projection each; conv_head
    assert sum(isinstance(m, PointwiseConvAsGemm) for m in model.trunk.modules()) == 15  # blocks 0-3: 1 + 2x7
    assert sum(isinstance(m, CroppingConv2dSame) for m in model.body.modules()) == 1  # block 5's stride-2 5x5
    stock = copy.deepcopy(model)
    for m in stock.modules():
        if isinstance(m, PointwiseConvAsGemm):
            m.__class__ = nn.Conv2d
        if isinstance(m, CroppingConv2dSame):
            m.__class__ = Conv2dSame
    # whatever the CPU computes with, the count is the stock network's (no kernel change moves a budget)
    assert split_macs(model, (3, 32, 32)) == split_macs(stock, (3, 32, 32))
    with torch.no_grad():
        x = torch.randn(3, 3, 32, 32)
        torch.testing.assert_close(model.eval()(x), stock.eval()(x), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_swapped_layers_give_the_stock_bits_and_adamw_is_not_fused():
    """The kernel set is the CPU's: on CUDA the swapped layers compute with the stock convolutions (the
    depthwise crop is exact and ran on CUDA before), and AdamW is not fused, so CUDA runs keep their bits."""
    from bench_stability_gap.harness.model.fastoptim import adamw

    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    spec = load_protocol("tiny_cil").backbone
    model = split_network(create_network(spec), spec, 10).cuda().train()
    before = copy.deepcopy(model)
    for m in before.modules():  # what computed on CUDA before the CPU kernel set
        if isinstance(m, PointwiseConvAsGemm):
            m.__class__ = nn.Conv2d
        if isinstance(m, CroppingConv2dSame):
            m.__class__ = Conv2dSame
    x = torch.randn(8, 3, 32, 32, device="cuda")
    outs = [m(x) for m in (model, before)]
    assert torch.equal(outs[0], outs[1])
    for out in outs:
        out.square().sum().backward()
    grads = [(name, p.grad, q.grad) for (name, p), q in zip(model.named_parameters(), before.parameters())]
    assert sum(a is not None for _, a, _ in grads) >= 70  # the body's and the head's (the trunk is frozen)
    for name, a, b in grads:
        assert (a is None and b is None) or torch.equal(a, b), name
    assert adamw([{"params": list(model.parameters())}]).defaults["fused"] is None


UNSPLITTABLE = [
    ({"lora_targets": ["conv_pw", "nope"]}, ["backbone.lora_targets names 'nope'", "backbone.body"]),
    ({"body": ["blocks.5", "blocks.6", "conv_head", "bn2", "global_pool"]},  # blocks.4 missing
     ["backbone.trunk (", "backbone.body (blocks.5,", "do not run as one network", "112 channels"]),
    ({"body": ["blocks.4", "blocks.5", "blocks.6", "conv_head", "bn2"]},  # no pooling before the head
     ["backbone.body (blocks.4,", "do not run as one network", "pooled features"]),
]


@pytest.mark.parametrize("update, needles", UNSPLITTABLE)
def test_bench_validate_builds_the_network_and_refuses_parts_that_do_not_split(tmp_path, update, needles):
    """`bench validate` said OK to such a protocol: the split's checks ran only when a run split it."""
    import yaml
    from click.testing import CliRunner
    from support import refused

    from bench_stability_gap.harness.cli import main

    data = load_protocol("tiny_cil").model_dump(mode="json")
    data.update(name="unsplittable", backbone={**data["backbone"], **update})
    path = tmp_path / "unsplittable.yaml"
    path.write_text(yaml.safe_dump(data))
    refused(CliRunner().invoke(main, ["validate", "--build", str(path)]), *needles, lines=3)


@pytest.mark.parametrize("update, needles", UNSPLITTABLE)
def test_parts_that_do_not_make_one_network_are_refused_before_any_compute(update, needles):
    """Checked where the network is split (before the trunk pass and the deployed model's training): a
    LoRA target the body lacks, or a body that does not continue the trunk, named by its lists."""
    spec = load_protocol("tiny_cil").backbone.model_copy(update=update)
    with pytest.raises(BenchError) as err:
        split_network(create_network(spec), spec, 10)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_the_forward_that_checks_the_parts_leaves_the_batchnorm_statistics_and_modes_alone():
    spec = load_protocol("tiny_cil").backbone
    net = create_network(spec).train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = split_network(net, spec, 10)
    assert model.body.training and all(torch.equal(before[k], v) for k, v in net.state_dict().items())
