"""Vanilla's two readings on the ConvNeXtV2 paper protocols (docs/fidelity.md): the published code's
(``pointwise: lora``, decay in the published module order) by default, the text's full fine-tuning on
request. Counted on the real backbone definition (timm, random init, nothing downloaded)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from support import fake_training
from bench_stability_gap.harness.model.backbone import SplitModel, create_network, split_network
from bench_stability_gap.harness.model.compute import ComputeEnv
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method

LR = 1e-3


def _places(protocol: str = "cil_places_lt") -> tuple[SplitModel, object]:
    p = load_protocol(protocol)
    spec = p.backbone.model_copy(update={"weights": "none:"})
    return split_network(create_network(spec), spec, 1365), p


def _vanilla(overrides: dict | None = None, method: str = "vanilla"):
    model, p = _places()
    _, m = build_method(method, p, {"lr": LR, **(overrides or {})})
    m.setup(model, SimpleNamespace(protocol=p, generator=torch.Generator().manual_seed(0),
                                   compute=ComputeEnv.for_run(torch.device("cpu"))))
    return model, m


# The published plastic part, yousuf907/SGM convnext_v2_lora.py ConvNeXt_block2 on convnextv2_femto:
# named_parameters() in registration order (downsample_layers before stages, loralib's lora_A/lora_B after
# weight/bias), mapped to bench's timm names. Frozen: loralib freezes each pointwise weight (r > 0).
def _published_block(pub: str, timm: str) -> list[tuple[str, str, bool]]:
    rows = [("dwconv.weight", "conv_dw.weight"), ("dwconv.bias", "conv_dw.bias"), ("norm.weight", "norm.weight"),
            ("norm.bias", "norm.bias")]
    for k in (1, 2):
        if k == 2:
            rows += [("grn.gamma", "mlp.grn.weight"), ("grn.beta", "mlp.grn.bias")]
        fc = f"mlp.fc{k}"
        rows += [(f"pwconv{k}.weight", f"{fc}.base_layer.weight"), (f"pwconv{k}.bias", f"{fc}.base_layer.bias"),
                 (f"pwconv{k}.lora_A", f"{fc}.lora_A.default.weight"), (f"pwconv{k}.lora_B", f"{fc}.lora_B.default.weight")]
    return [(f"{pub}.{a}", f"{timm}.{b}", not (a.startswith("pwconv") and a.endswith(".weight"))) for a, b in rows]


def published_order() -> list[tuple[str, str, bool]]:
    """(published name, timm path in the split model's body/head, trainable), in registration order."""
    rows = [("model.downsample_layers.0.0.weight", "stages.3.downsample.0.weight", True),
            ("model.downsample_layers.0.0.bias", "stages.3.downsample.0.bias", True),
            ("model.downsample_layers.0.1.weight", "stages.3.downsample.1.weight", True),
            ("model.downsample_layers.0.1.bias", "stages.3.downsample.1.bias", True)]
    for j in range(6):
        rows += _published_block(f"model.stages.0.{j}", f"stages.2.blocks.{j}")
    for j in range(2):
        rows += _published_block(f"model.stages.1.{j}", f"stages.3.blocks.{j}")
    return rows + [("model.norm.weight", "head.norm.weight", True), ("model.norm.bias", "head.norm.bias", True),
                   ("model.head.weight", "fc.weight", True), ("model.head.bias", "fc.bias", True)]


def _bench_tensor(model: SplitModel, body: list[str], timm: str) -> torch.nn.Parameter:
    if timm.startswith("fc."):
        return model.head.get_parameter(timm)
    entry = max((b for b in body if timm.startswith(b + ".")), key=len)
    return model.body[body.index(entry)].get_parameter(timm[len(entry) + 1:])


def _published_block_order_sanity() -> None:
    # the block's tensors in loralib/ConvNeXtV2 registration order: dwconv, norm, pwconv1 (w, b, A, B),
    # grn, pwconv2 (w, b, A, B)
    names = [p for p, _, _ in _published_block("b", "t")]
    assert names == ["b.dwconv.weight", "b.dwconv.bias", "b.norm.weight", "b.norm.bias", "b.pwconv1.weight",
                     "b.pwconv1.bias", "b.pwconv1.lora_A", "b.pwconv1.lora_B", "b.grn.gamma", "b.grn.beta",
                     "b.pwconv2.weight", "b.pwconv2.bias", "b.pwconv2.lora_A", "b.pwconv2.lora_B"]


def test_default_vanilla_on_cil_places_lt_trains_what_the_published_vanilla_trains():
    _published_block_order_sanity()
    model, m = _vanilla()
    assert (m.config.pointwise, m.config.layer_decay_order) == ("lora", "registration")
    # body 4,550,016 - pointwise weights (6 * 2 * 192 * 768 + 2 * 2 * 384 * 1536 = 4,128,768) + adapters
    # (6 * 2 * 48 * (192 + 768) + 2 * 2 * 48 * (384 + 1536) = 921,600) + head 384 * 1365 + 1365 = 525,525
    assert model.head.num_classes == 1365
    assert model.trainable_parameters() == 1_868_373
    pub = published_order()
    assert len(pub) == 120 and sum(t for _, _, t in pub) == 104
    body = load_protocol("cil_places_lt").backbone.body
    for _, timm, trainable in pub:
        assert _bench_tensor(model, body, timm).requires_grad == trainable, timm


def test_each_trainable_tensor_gets_lr_times_0_9_to_its_index_in_the_published_order_from_the_head():
    model, m = _vanilla()
    groups = m.build_optimizer(10)[0].param_groups
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert sum(len(g["params"]) for g in groups) == 104
    body = load_protocol("cil_places_lt").backbone.body
    for i, (name, timm, trainable) in enumerate(reversed(published_order())):
        p = _bench_tensor(model, body, timm)
        if trainable:
            assert lr_of.pop(id(p)) == pytest.approx(LR * 0.9**i, rel=1e-12), name
        else:
            assert id(p) not in lr_of, name
    assert not lr_of  # nothing trains that the published vanilla does not train
    # e.g. the deepest tensor, downsample_layers.0.0.weight at i = 119: 1e-3 * .9^119
    first = _bench_tensor(model, body, "stages.3.downsample.0.weight")
    assert {id(p): g["lr"] for g in groups for p in g["params"]}[id(first)] == pytest.approx(LR * 0.9**119)


def test_the_texts_switch_trains_every_body_tensor_with_no_adapters():
    model, m = _vanilla({"pointwise": "trained", "layer_decay_order": "body"})
    assert model.trainable_parameters() == 5_075_541
    assert not any("lora_" in n for n, _ in model.named_parameters())
    groups = m.build_optimizer(10)[0].param_groups
    assert len(groups) == 88  # 8 blocks x 10 tensors + downsample 4 + head norm 2 + head 2
    # forward order: the downsample sits between stage 2 and stage 3 (index 2 + 2 + 20 from the head)
    lrs = {g["name"]: g["lr"] for g in groups}
    assert lrs["body.6.0.weight"] == pytest.approx(LR * 0.9**(4 + 20 + 3))


def test_vanilla_with_sgm_leaves_the_pointwise_layers_to_sgms_own_adapters():
    # the published SGM adapts the same LoRA blocks, fresh each session and folded at its end: vanilla
    # injects nothing of its own, so vanilla+sgm trains adapters + head only (1,447,125 after injection)
    model, m = _vanilla(method="vanilla+sgm")
    assert m.config.pointwise == "lora" and m.modifier_adapts_pointwise()
    assert not any("lora_" in n for n, _ in model.named_parameters())


def test_embedded_and_other_backbones_keep_full_fine_tuning():
    for protocol in ("tiny_cil", "cil_convnextv1_places_lt", "cil_mobilevit_places_lt"):
        cfg = build_method("vanilla", protocol)[1].config
        assert (cfg.pointwise, cfg.layer_decay_order) == ("trained", "body"), protocol
    # methods built on vanilla are not silently moved to the code's reading
    for method in ("derpp", "gdumb", "lwf", "remind"):
        cfg = build_method(method, "cil_places_lt")[1].config
        assert not hasattr(cfg, "pointwise") and cfg.layer_decay_order == "body", method


def test_registered_first_must_name_body_entries(tmp_path):
    from bench_stability_gap.harness.errors import BenchError

    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: cil_places_lt\nname: bad\nbackbone: {registered_first: [stages.1]}\n")
    with pytest.raises(BenchError, match="registered_first names stages.1"):
        load_protocol(str(bad))


def test_code_reading_adapters_train_and_are_never_folded():
    # a tiny body: Linear pointwise layer (the published pwconv) between two trainable tensors
    import numpy as np
    from torch import nn

    from bench_stability_gap.harness.model.backbone import GrowingHead
    from bench_stability_gap.harness.data.stream import Session
    from bench_stability_gap.methods.base import TrainBatch
    from bench_stability_gap.methods.baselines import Vanilla
    from bench_stability_gap.methods.sgm.lora import lora_modules

    torch.manual_seed(0)
    body = nn.Sequential(nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4)))
    model = SplitModel(nn.Sequential(nn.Identity()), body, GrowingHead(4, 3))
    method = Vanilla(Vanilla.Config(pointwise="lora", pointwise_rank=2, lr=1e-2))
    protocol = SimpleNamespace(name="t", backbone=SimpleNamespace(lora_targets=["1"]),
                               training=fake_training(3))
    method.setup(model, SimpleNamespace(protocol=protocol, generator=torch.Generator().manual_seed(0),
                                        compute=ComputeEnv.for_run(torch.device("cpu"))))
    (_, layer), = lora_modules(model.body)
    w0 = layer.get_base_layer().weight.detach().clone()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"body.0.0.weight", "body.0.0.bias", "body.0.1.base_layer.bias",
                         "body.0.1.lora_A.default.weight", "body.0.1.lora_B.default.weight",
                         "head.fc.weight", "head.fc.bias"}
    session = Session(index=2, train_ids=np.arange(4), classes=np.arange(3), new_classes=np.arange(3), seen_classes=3)
    for _ in range(2):  # two sessions: the adapters carry over, nothing folds
        method.begin_session(session)
        for _ in range(3):
            method.observe(TrainBatch(torch.randn(4, 4), torch.tensor([0, 1, 2, 0]), np.arange(4),
                                      torch.ones(4, dtype=torch.bool)))
        method.end_session(session)
        assert lora_modules(model.body) and torch.equal(layer.get_base_layer().weight, w0)
    assert layer.lora_B["default"].weight.abs().sum() > 0  # the adapter learnt (B starts at 0)
