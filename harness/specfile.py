"""YAML specs (protocols, sweeps) shipped with bench under ``protocols/`` or given by path: one way to
find, parse and validate them, so every kind reports a bad file the same way (one paragraph naming the
field and value, exit code 2)."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import BenchError, did_you_mean

Spec = TypeVar("Spec", bound=BaseModel)


def _folder(folder: str) -> Traversable:
    base = resources.files("bench_stability_gap.protocols")
    return base / folder if folder else base


def builtin_names(folder: str = "") -> list[str]:
    """Names of the YAML files shipped in ``protocols/<folder>``."""
    return sorted(p.name[:-5] for p in _folder(folder).iterdir() if p.name.endswith(".yaml"))


def format_validation_error(err: ValidationError, what: str, origin: str) -> str:
    problems = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        value = f" (got {e['input']!r})" if e["type"] != "missing" and not isinstance(e["input"], dict) else ""
        problems.append(f"{field}: {e['msg']}{value}")
    return f"Invalid {what} {origin}: " + "; ".join(problems) + "."


def _mapping(text: str, what: str, origin: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BenchError(f"{what.capitalize()} {origin} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise BenchError(f"{what.capitalize()} {origin} must be a YAML mapping, got {type(data).__name__}.")
    return data


def merge_over(base: dict, override: dict) -> dict:
    """``override`` on top of ``base``: mappings merge key by key, anything else (lists included:
    a new ``stream_data`` replaces the old one whole) replaces the base's value."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge_over(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve_extends(data: dict, what: str, origin: str, folder: str = "", seen: tuple[str, ...] = ()) -> dict:
    """``extends: NAME`` (a shipped spec) or ``extends: path.yaml`` (relative to the extending file):
    the base's fields with this file's on top, so a variant restates only what it changes."""
    if "extends" not in data:
        return data
    base_ref = data["extends"]
    if not isinstance(base_ref, str):
        raise BenchError(f"{what.capitalize()} {origin}: extends must name a shipped {what} or a YAML path, "
                         f"got {base_ref!r}.")
    if base_ref in seen or len(seen) > 8:
        raise BenchError(f"{what.capitalize()} {origin}: extends forms a cycle ({' -> '.join((*seen, base_ref))}).")
    path = Path(base_ref)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_absolute() and Path(origin).suffix in (".yaml", ".yml"):
            path = Path(origin).parent / path
        if not path.is_file():
            raise BenchError(f"{what.capitalize()} {origin}: extends names {path}, which does not exist.")
        text, base_origin = path.read_text(), str(path)
    else:
        names = builtin_names(folder)
        if base_ref not in names:
            raise did_you_mean(base_ref, names, what)
        text, base_origin = (_folder(folder) / f"{base_ref}.yaml").read_text(), base_ref
    base = resolve_extends(_mapping(text, what, base_origin), what, base_origin, folder, (*seen, base_ref))
    return merge_over(base, {k: v for k, v in data.items() if k != "extends"})


def parse_spec(model: type[Spec], text: str, what: str, origin: str, folder: str = "") -> Spec:
    """Validate YAML text as ``model`` (after ``extends``); every problem becomes a BenchError naming the field."""
    data = resolve_extends(_mapping(text, what, origin), what, origin, folder)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BenchError(format_validation_error(exc, what, origin)) from None


def load_spec(model: type[Spec], name_or_path: str, what: str, folder: str = "") -> Spec:
    """A built-in spec by name (``protocols/<folder>/NAME.yaml``), or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise BenchError(f"{what.capitalize()} file {path} does not exist.")
        return parse_spec(model, path.read_text(), what, str(path), folder)
    names = builtin_names(folder)
    if name_or_path not in names:
        raise did_you_mean(name_or_path, names, what)
    return parse_spec(model, (_folder(folder) / f"{name_or_path}.yaml").read_text(), what, name_or_path, folder)
