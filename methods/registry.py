"""Methods and modifiers from entry points (``bench.methods``, ``bench.modifiers``), built-ins included.

Loading is lazy: listing names imports nothing. Each entry records the distribution and version that
supplied it, and every result carries that. A plugin that fails to import, or two distributions that
claim one name, is a clear error naming both, never a silent disappearance.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from ..harness.errors import BenchError, did_you_mean
from ..harness.spec.specfile import format_validation_error, safe_yaml

if TYPE_CHECKING:
    from ..harness.spec.protocol import Protocol
    from ..harness.spec.specfile import JSONValue
    from .base import Method

METHOD_GROUP = "bench.methods"
MODIFIER_GROUP = "bench.modifiers"


@dataclass(frozen=True)
class Entry:
    name: str
    group: str
    target: str           # "module:attr"
    distribution: str
    version: str

    # dynamic: the entry point's object (a plugin's method or modifier class), whatever its code defines
    def load(self) -> Any:
        try:
            return metadata.EntryPoint(self.name, self.target, self.group).load()
        except Exception as exc:
            raise BenchError(
                f"Plugin {self.name!r} ({self.group} entry point {self.target!r} from distribution "
                f"{self.distribution} {self.version}) failed to import: {type(exc).__name__}: {exc}"
            ) from None


@cache
def entries(group: str) -> dict[str, Entry]:
    found: dict[str, Entry] = {}
    for ep in metadata.entry_points(group=group):
        dist = ep.dist
        entry = Entry(ep.name, group, ep.value, dist.name if dist else "unknown", dist.version if dist else "unknown")
        prior = found.get(ep.name)
        if prior is not None and (prior.distribution, prior.target) != (entry.distribution, entry.target):
            raise BenchError(
                f"Two packages claim the {group} name {ep.name!r}: {prior.distribution} {prior.version} "
                f"({prior.target}) and {entry.distribution} {entry.version} ({entry.target}). "
                f"Uninstall one of them or rename its entry point."
            )
        found[ep.name] = entry
    return found


def summary(entry: Entry) -> str:
    """The one-line ``summary`` an entry's class declares, read from its source without importing it (a
    method's module imports torch, which costs a catalogue half a minute on a loaded machine). A summary
    that is not a plain string in the class body is read by loading the entry; code that cannot be found
    is marked as failing to import, as loading it would."""
    module, _, attr = entry.target.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        spec, missing = None, f"{type(exc).__name__}: {exc}"
    else:
        missing = f"ModuleNotFoundError: no module named {module!r}"
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        if spec is None:
            return f"[fails to import] Plugin {entry.name!r} ({entry.distribution} {entry.version}): {missing}"
        return str(getattr(entry.load(), "summary", ""))
    found = _class_summary(Path(spec.origin), attr)
    return found if found is not None else str(getattr(entry.load(), "summary", ""))


def _class_summary(path: Path, cls: str) -> str | None:
    """``cls.summary`` when the class body of ``path`` assigns it a literal string (implicit concatenation
    included), else None."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "summary"
                                                        for t in item.targets):
                    value = item.value
                    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                        else None
    return None


SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".json", ".cfg", ".txt")


def code_package(module: str) -> tuple[str, bool]:
    """The outermost real package (a folder with ``__init__.py``) holding ``module`` (``bench_example_plugin``,
    ``bench_stability_gap.methods``) and True, or ``module`` itself and False for a single-module plugin. Its
    parents are imported to find it; the entry is loaded anyway."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and spec.origin not in ("built-in", "frozen"):
            return name, spec.submodule_search_locations is not None
    raise BenchError(f"Cannot locate the code of module {module!r} to record its content hash.")


def code_root(module: str) -> Path:
    """The code an entry point comes from (``code_package``): the package's folder, or the module's file."""
    spec = importlib.util.find_spec(code_package(module)[0])
    assert spec is not None and spec.origin is not None
    origin = Path(spec.origin)
    return origin.parent if spec.submodule_search_locations else origin


@cache
def _tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))
    for path in files:
        digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def code_hash(used: Iterable[Entry]) -> str:
    """Content hash of the code behind a method string (its base's and modifiers' packages, with each
    distribution's name and version): an edited editable install is a new version on the leaderboard."""
    digest = hashlib.sha256()
    for entry in sorted(set(used), key=lambda e: (e.distribution, e.target)):
        root = code_root(entry.target.partition(":")[0])
        digest.update(f"{entry.distribution}=={entry.version}:{_tree_hash(root)}\n".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method string ``base(+modifier)*``."""

    text: str
    base: Entry
    modifiers: tuple[Entry, ...]


def parse_method(text: str) -> MethodSpec:
    """``base(+modifier)*`` checked against entry-point names only (nothing is imported)."""
    if any(c.isspace() for c in text):
        raise BenchError(f"Method string {text!r} contains whitespace: write it as one word, e.g. vanilla+sgm.")
    parts = text.split("+")
    if not all(parts):
        raise BenchError(f"Method string {text!r} is malformed: use base(+modifier)*, e.g. vanilla+sgm.")
    methods, modifiers = entries(METHOD_GROUP), entries(MODIFIER_GROUP)
    base, *mods = parts
    if base not in methods:
        if base in modifiers:
            raise BenchError(f"{base!r} is a modifier, not a method: put a base first, e.g. vanilla+{base}.")
        if base == "joint":
            raise BenchError("'joint' is the harness's upper-bound reference (A_joint), trained by `bench run -m "
                             "joint` with the protocol's joint section; it is not a method plugin, so it takes no "
                             "modifiers and there is nothing of it to check or tune.")
        raise did_you_mean(base, [*methods, "joint"], "method")  # joint: the harness's reference
    for m in mods:
        if m not in modifiers:
            raise did_you_mean(m, modifiers, "modifier")
    if len(set(mods)) != len(mods):
        raise BenchError(f"Method string {text!r} repeats a modifier.")
    return MethodSpec(text, methods[base], tuple(modifiers[m] for m in mods))


DEFAULTS_FILE = "defaults.yaml"


@cache
def _defaults_file(root: Path) -> dict:
    path = (root if root.is_dir() else root.parent) / DEFAULTS_FILE
    if not path.is_file():
        return {}
    try:
        table = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise BenchError(f"Defaults file {path} is not valid YAML: {exc}") from None
    if not isinstance(table, dict):
        raise BenchError(f"Defaults file {path} must map method names to their entries, not {type(table).__name__}.")
    return table


def defaults_file(entry: Entry) -> tuple[dict, Path]:
    """The ``defaults.yaml`` beside the package an entry point comes from (built-ins: methods/defaults.yaml;
    a plugin ships its own the same way), and its path; only the entry's own names are read from it."""
    try:
        root = code_root(entry.target.partition(":")[0])
    except BenchError:  # code that cannot be located has no defaults file (loading it fails, naming it)
        return {}, Path(DEFAULTS_FILE)
    path = (root if root.is_dir() else root.parent) / DEFAULTS_FILE
    return _defaults_file(root), path


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """``--set key=value`` pairs, values parsed as YAML scalars (1e-3, true, 48)."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise BenchError(f"--set {pair!r} must look like key=value (e.g. --set lr=0.001).")
        name, parsed = key.strip(), safe_yaml(value, "--set", repr(pair))
        if name in out and out[name] != parsed:  # which one would win is a guess the user should not have to make
            raise BenchError(f"--set {name} is given twice, as {out[name]!r} and {parsed!r}: give it once.")
        out[name] = parsed
    return out


def _lookup(spec: dict[str, JSONValue], dotted: str) -> JSONValue:
    value: JSONValue = spec
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


# table: the method's part of a defaults.yaml, as YAML read it (its rules' shape is checked here)
def protocol_defaults(table: dict[str, Any], protocol: Protocol | str, where: str = "defaults") -> dict[str, object]:
    """One method's defaults for ``protocol``: ``default``, then name globs (``cil_places_std_*``, for a
    family of paper protocols), then every ``when`` rule whose ``match`` holds for the protocol's
    properties (dotted spec fields, e.g. ``backbone.model``; in file order), then the entry named after
    the protocol; later wins. Rules on properties are what a copy of a protocol under another name still
    matches: the embedded family's tuned settings (SGM's init scaling) use them."""
    values = dict(table.get("default") or {})
    name = protocol if isinstance(protocol, str) else protocol.name
    for key, entry in table.items():  # name globs (a paper family: cil_places_std_*), in file order
        if key != name and any(c in key for c in "*?[") and fnmatchcase(name, key):
            values.update(entry)
    spec = protocol.model_dump(mode="json") if not isinstance(protocol, str) else None
    for i, rule in enumerate(table.get("when") or []):
        if not isinstance(rule, dict) or set(rule) != {"match", "set"}:
            raise BenchError(f"{where}: when[{i}] must have exactly the keys match and set, got {rule!r}.")
        if spec is None:
            continue
        try:
            if all(_lookup(spec, k) == v for k, v in rule["match"].items()):
                values.update(rule["set"])
        except KeyError as exc:
            raise BenchError(f"{where}: when[{i}].match names {exc.args[0]!r}, which is not a protocol field "
                             f"(use dotted spec paths such as backbone.model or training.updates).") from None
    values.update(table.get(name) or {})
    return values


def resolve_config(config_cls: type[BaseModel], entry: Entry, protocol: Protocol | str, overrides: dict[str, object],
                   method_string: str | None = None) -> BaseModel:
    """Config defaults < the entry's defaults (see ``protocol_defaults``) < the same under the full method
    string (``derpp+sgm``: a setting the paper gives one combination applies to it alone) < --set."""
    table, path = defaults_file(entry)
    where = f"{path} ({entry.name})"
    values = protocol_defaults(table.get(entry.name) or {}, protocol, where)
    if method_string and method_string != entry.name:
        values.update(protocol_defaults(table.get(method_string) or {}, protocol, f"{path} ({method_string})"))
    values.update(overrides)
    try:
        return config_cls(**values)
    except ValidationError as exc:
        known = ", ".join(config_cls.model_fields)
        raise BenchError(f"{format_validation_error(exc, 'configuration for method', repr(entry.name))} "
                         f"Its settings are: {known}.") from None


def config_class(entry: Entry) -> type[BaseModel]:
    """An entry's settings model without importing its code when bench ships it (methods.configs is
    torch-free, so a bad ``--set`` is answered in well under a second); a plugin's class is loaded."""
    from .configs import CONFIGS

    known = CONFIGS.get(entry.target)
    return known if known is not None else entry.load().Config


def resolve_settings(spec: MethodSpec, protocol: Protocol | str,
                     overrides: dict[str, object]) -> tuple[BaseModel, list[BaseModel]]:
    """The base method's config and each modifier's, from ``--set`` keys (``key`` for the base,
    ``modifier.key`` for a modifier); every bad key or value is a BenchError naming it."""
    overrides = dict(overrides)
    mod_overrides: dict[str, dict[str, object]] = {}
    for key in [k for k in overrides if "." in k]:
        owner, _, field = key.partition(".")
        mod_overrides.setdefault(owner, {})[field] = overrides.pop(key)
    mod_configs = [resolve_config(config_class(entry), entry, protocol, mod_overrides.pop(entry.name, {}))
                   for entry in spec.modifiers]
    if mod_overrides:
        raise BenchError(f"--set names modifier(s) {', '.join(mod_overrides)} not in method {spec.text!r}.")
    canonical = "+".join([spec.base.name, *(m.name for m in spec.modifiers)])
    config = resolve_config(config_class(spec.base), spec.base, protocol, overrides, canonical)
    clash = [m.name for m in spec.modifiers if m.name in type(config).model_fields]
    if clash:
        raise BenchError(f"Modifier {clash[0]!r} has the name of a setting of method {spec.base.name!r}; "
                         f"rename the modifier's entry point.")
    return config, mod_configs


def check_method(text: str, protocol: Protocol | str, overrides: dict[str, object] | None = None) -> MethodSpec:
    """Everything about ``-m`` and ``--set`` that can be checked without importing torch: names
    against entry points, settings against the (torch-free) configs of built-ins."""
    spec = parse_method(text)
    if isinstance(protocol, str):
        protocol = _builtin_or_name(protocol)
    resolve_settings(spec, protocol, overrides or {})
    return spec


def build_method(text: str, protocol: Protocol | str, overrides: dict[str, object] | None = None):
    """Instantiate ``base+mod+mod`` with its resolved config; an unsupported combination is an error.
    ``protocol``: the spec (its properties pick the defaults), or a name (a built-in's spec is loaded;
    another name gets ``default`` and its own named entry only)."""
    if isinstance(protocol, str):
        protocol = _builtin_or_name(protocol)
    spec = parse_method(text)
    cls = spec.base.load()
    if spec.modifiers and not getattr(cls, "uses_standard_step", False):
        raise BenchError(
            f"Method {spec.base.name!r} does not use the standard training step, so modifiers "
            f"({', '.join(m.name for m in spec.modifiers)}) cannot be applied to it."
        )
    allowed = getattr(cls, "compatible_modifiers", None)
    refused = [m.name for m in spec.modifiers if allowed is not None and m.name not in allowed]
    if refused:
        raise BenchError(f"Method {spec.base.name!r} declares that it works with the modifiers "
                         f"{', '.join(allowed or ()) or '(none)'} only (its compatible_modifiers), so it cannot "
                         f"take {', '.join(refused)}: drop {', '.join(refused)} from {text!r}.")
    config, mod_configs = resolve_settings(spec, protocol, overrides or {})
    modifiers = [entry.load()(mod_config) for entry, mod_config in zip(spec.modifiers, mod_configs)]
    if not isinstance(protocol, str):
        for m in modifiers:
            getattr(m, "check_base", lambda *_: None)(cls, protocol)
    return spec, cls(config, modifiers)


def _builtin_or_name(name: str) -> Protocol | str:
    from ..harness.spec.protocol import builtin_protocol_names, load_protocol

    return load_protocol(name) if name in builtin_protocol_names() else name


def method_settings(method: Method) -> dict[str, JSONValue]:
    """Everything a run was configured with: the base method's settings, and each modifier's under its
    name (``{"lr": ..., "sgm": {"lora": {"rank": 48}, ...}}``), as ``--set`` addresses them."""
    out = method.config.model_dump(mode="json")
    for m in getattr(method, "modifiers", []):
        out[m.name] = m.config.model_dump(mode="json")
    return out
